package api_test

import (
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/shizu-gpu/shizu/services/gateway/api"
)

func TestTheDocumentIsValidOpenAPI(t *testing.T) {
	t.Parallel()
	doc, err := api.Load(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if doc.OpenAPI != "3.0.3" {
		t.Fatalf("openapi %s, want 3.0.3", doc.OpenAPI)
	}
}

// Every object schema is closed: additionalProperties false, or a map of
// one declared value type (labels). The document's own schema is the one
// exception.
func TestEveryObjectSchemaIsClosed(t *testing.T) {
	t.Parallel()
	doc, err := api.Load(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[*openapi3.Schema]bool{}
	var walk func(where string, s *openapi3.SchemaRef)
	walk = func(where string, ref *openapi3.SchemaRef) {
		if ref == nil || ref.Value == nil || seen[ref.Value] {
			return
		}
		s := ref.Value
		seen[s] = true
		if s.Type.Is("object") && where != "OpenAPIDocument" {
			ap := s.AdditionalProperties
			closed := ap.Has != nil && !*ap.Has
			isMap := ap.Schema != nil && len(s.Properties) == 0
			if !closed && !isMap {
				t.Errorf("schema %s is open: set additionalProperties: false", where)
			}
		}
		for name, p := range s.Properties {
			walk(where+"."+name, p)
		}
		walk(where+"[]", s.Items)
		walk(where+"{}", s.AdditionalProperties.Schema)
		for _, a := range s.AllOf {
			walk(where, a)
		}
	}
	for name, s := range doc.Components.Schemas {
		walk(name, s)
	}
	if len(seen) < 10 || !strings.Contains(string(api.Document), `"additionalProperties": false`) {
		t.Fatalf("walked %d schemas", len(seen))
	}
}
