// Package api holds the tenant API's contract: the OpenAPI 3.0.3
// document (openapi.json, written by hand and committed), embedded as it
// is so the gateway serves it byte for byte, and loaded and validated
// with kin-openapi for request and response validation.
package api

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/getkin/kin-openapi/openapi3"
)

// Document is openapi.json, byte for byte.
//
//go:embed openapi.json
var Document []byte

// Load parses Document and validates it as an OpenAPI 3.0 document.
func Load(ctx context.Context) (*openapi3.T, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(Document)
	if err != nil {
		return nil, fmt.Errorf("openapi.json: %w", err)
	}
	if err := doc.Validate(ctx); err != nil {
		return nil, fmt.Errorf("openapi.json is not a valid OpenAPI document: %w", err)
	}
	return doc, nil
}
