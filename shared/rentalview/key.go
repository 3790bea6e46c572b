package rentalview

import (
	"fmt"

	"github.com/shizu-gpu/shizu/shared/subject"
)

// key is the record's key of a tenant's rental; both must be valid
// subject tokens (fault-free input is the caller's: Get/List check it).
func key(tenant, rental string) string { return escape(tenant) + "." + escape(rental) }

// escape and unescape are the key escaping of every bucket keyed by
// subject tokens (subject.KeyToken).
func escape(tok string) string { return subject.KeyToken(tok) }

func unescape(s string) (string, bool) { return subject.ParseKeyToken(s) }

// checkTokens says what is wrong with a tenant or rental id.
func checkTokens(tenant, rental string) error {
	if err := subject.Token(tenant); err != nil {
		return fmt.Errorf("tenant: %w", err)
	}
	if err := subject.Token(rental); err != nil {
		return fmt.Errorf("rental id: %w", err)
	}
	return nil
}
