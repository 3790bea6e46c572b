package ledger

import "math/bits"

// The amount of a usage is price_per_gpu_hour × gpu_count × milli_gpu/1000 ×
// seconds/3600. Its exact value is a numerator over unitDivisor; amounts
// are whole micro-units, rounded half up once per run segment on the
// cumulative numerator, so every record's amount is
// round(cumulative after) − round(cumulative before) and the records of a
// segment add up to the rounded exact total: the micro-unit is never lost
// or double-counted by splitting usage into intervals.
const unitDivisor = 3600 * 1000

// accrual is a non-negative numerator q·unitDivisor + r with 0 ≤ r <
// unitDivisor, kept split so it never overflows.
type accrual struct{ q, r uint64 }

// add adds a×b (each fits in 63 bits; their product stays far below
// unitDivisor·2^64 for every value the catalogue bounds allow).
func (a *accrual) add(x, y uint64) {
	hi, lo := bits.Mul64(x, y)
	q, r := bits.Div64(hi, lo, unitDivisor)
	a.q += q
	a.r += r
	if a.r >= unitDivisor {
		a.q++
		a.r -= unitDivisor
	}
}

// micros rounds the accrual half up to whole micro-units.
func (a accrual) micros() int64 {
	if 2*a.r >= unitDivisor {
		return int64(a.q + 1)
	}
	return int64(a.q)
}

// AmountMicros is price × gpuCount × milli/1000 × seconds/3600 rounded half
// up to a whole micro-unit: the amount of a usage billed in one piece.
func AmountMicros(pricePerGPUHour int64, gpuCount, milliGPU int32, seconds int64) int64 {
	var a accrual
	a.add(uint64(pricePerGPUHour)*uint64(gpuCount)*uint64(milliGPU), uint64(seconds))
	return a.micros()
}
