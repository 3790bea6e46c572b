package rent

import (
	"math"
	"strings"

	"github.com/shizu-gpu/shizu/shared/fault"
)

// MicrosPerUnit is how many micro-units make one unit of a currency: Shizu
// counts money in integer micro-units, never floats.
const MicrosPerUnit = 1_000_000

// ParseMicros reads a non-negative decimal amount of a currency ("2.49",
// "100", "0.000001") as micro-units. It accepts digits with at most six
// decimals and any amount that fits an int64 of micro-units (up to
// 9223372036854.775807); a sign, an exponent ("1e3"), a seventh decimal,
// an empty string or a larger amount are invalid input (fault.IsInvalid).
// Prices and budgets are both this: the ledger multiplies in 128 bits, so
// the only bound an amount needs is that it is representable.
func ParseMicros(s string) (int64, error) {
	s = strings.TrimSpace(s)
	whole, frac, _ := strings.Cut(s, ".")
	if whole == "" || len(frac) > 6 {
		return 0, fault.Invalid("%q is not an amount with at most 6 decimals", s)
	}
	if !digits(whole) || !digits(frac) {
		return 0, fault.Invalid("%q is not a non-negative amount", s)
	}
	var micros int64
	for _, c := range whole + frac + strings.Repeat("0", 6-len(frac)) {
		d := int64(c - '0')
		if micros > (math.MaxInt64-d)/10 {
			return 0, fault.Invalid("%q is more than the largest amount, %d.%06d", s,
				int64(math.MaxInt64)/MicrosPerUnit, int64(math.MaxInt64)%MicrosPerUnit)
		}
		micros = micros*10 + d
	}
	return micros, nil
}

func digits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
