package subject_test

import (
	"strings"
	"testing"

	"github.com/shizu-gpu/shizu/shared/subject"
)

// Every byte a token may hold maps to a valid KV key character run and
// back; the mapping is one to one (what KeyToken cannot produce is
// refused), and it never yields a '.'.
func TestAKeyTokenIsOneToOneAndAValidKey(t *testing.T) {
	t.Parallel()
	var all strings.Builder
	for c := range 256 {
		all.WriteByte(byte(c))
	}
	for _, tok := range []string{"acme", "r-1_x", "a=b", "tenant/with/slashes", "ünï", all.String()} {
		k := subject.KeyToken(tok)
		for i := 0; i < len(k); i++ {
			c := k[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '=') {
				t.Fatalf("KeyToken(%q) = %q holds %q, not a key character", tok, k, c)
			}
		}
		if back, ok := subject.ParseKeyToken(k); !ok || back != tok {
			t.Fatalf("ParseKeyToken(KeyToken(%q)) = %q, %v", tok, back, ok)
		}
	}
	for _, bad := range []string{"=61", "=4", "=zz", "=3d", "a.b", "x y"} {
		if got, ok := subject.ParseKeyToken(bad); ok {
			t.Errorf("ParseKeyToken(%q) = %q, want refused (KeyToken never writes it)", bad, got)
		}
	}
}
