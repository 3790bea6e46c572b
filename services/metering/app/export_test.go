package app

import "github.com/shizu-gpu/shizu/services/metering/pricing"

// Catalogue is the configured price catalogue, for tests that compute
// what should be billed.
func (c Config) Catalogue() (*pricing.Catalogue, error) {
	cat, _, err := c.load()
	return cat, err
}
