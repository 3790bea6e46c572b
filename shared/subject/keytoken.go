package subject

import "strings"

// A KV key allows [-/_=.A-Za-z0-9]; a subject token allows almost any byte
// but '.', '*', '>' and white space. KeyToken keeps [-_A-Za-z0-9] and writes
// every other byte as "=XX" (two upper-case hex digits), '=' too, so the
// mapping is one to one and never yields a '.': a key of several escaped
// tokens ("<tenant>.<rental>") splits back unambiguously. Every bucket keyed
// by a tenant or a rental id (RENTAL_VIEW, QUOTAS, BUDGETS) uses it.
func KeyToken(tok string) string {
	var b strings.Builder
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if keptInKey(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('=')
		b.WriteByte(upperHex[c>>4])
		b.WriteByte(upperHex[c&0xF])
	}
	return b.String()
}

// ParseKeyToken reverses KeyToken; ok is false for text KeyToken cannot
// produce (a kept byte escaped, lower-case hex, a stray '=').
func ParseKeyToken(s string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case keptInKey(c):
			b.WriteByte(c)
		case c == '=' && i+2 < len(s) && isUpperHex(s[i+1]) && isUpperHex(s[i+2]):
			v := hexVal(s[i+1])<<4 | hexVal(s[i+2])
			if keptInKey(v) {
				return "", false // KeyToken writes this byte as itself
			}
			b.WriteByte(v)
			i += 2
		default:
			return "", false
		}
	}
	return b.String(), true
}

const upperHex = "0123456789ABCDEF"

func keptInKey(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

func isUpperHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'A' && c <= 'F' }

func hexVal(c byte) byte {
	if c <= '9' {
		return c - '0'
	}
	return c - 'A' + 10
}
