package rentalview

import (
	"fmt"
	"strings"

	"github.com/shizu-gpu/shizu/shared/subject"
)

// A KV key allows [-/_=.A-Za-z0-9]; a subject token allows almost any
// byte but '.', '*', '>' and white space. escape keeps [-_A-Za-z0-9] and
// writes every other byte as "=XX" (two upper-case hex digits), '=' too,
// so the mapping is one to one and never yields a '.': the key
// "<tenant>.<rental>" splits back unambiguously.
func escape(tok string) string {
	var b strings.Builder
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "=%02X", c)
		}
	}
	return b.String()
}

// unescape reverses escape; ok is false for text escape cannot produce.
func unescape(s string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
			b.WriteByte(c)
		case c == '=' && i+2 < len(s) && isUpperHex(s[i+1]) && isUpperHex(s[i+2]):
			v := hexVal(s[i+1])<<4 | hexVal(s[i+2])
			if kept(v) {
				return "", false // escape writes this byte as itself
			}
			b.WriteByte(v)
			i += 2
		default:
			return "", false
		}
	}
	return b.String(), true
}

func kept(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

func isUpperHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'A' && c <= 'F' }

func hexVal(c byte) byte {
	if c <= '9' {
		return c - '0'
	}
	return c - 'A' + 10
}

// key is the record's key of a tenant's rental; both must be valid
// subject tokens (fault-free input is the caller's: Get/List check it).
func key(tenant, rental string) string { return escape(tenant) + "." + escape(rental) }

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
