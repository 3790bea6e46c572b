package ledger

import "sort"

// ExactTotal rounds Σ price×seconds×gm (per price) half up once, in 128-bit
// arithmetic: the reference the property tests compare records to.
func ExactTotal(perPrice map[int64]int64, gm int64) int64 {
	prices := make([]int64, 0, len(perPrice))
	for p := range perPrice {
		prices = append(prices, p)
	}
	sort.Slice(prices, func(i, j int) bool { return prices[i] < prices[j] })
	var a accrual
	for _, p := range prices {
		a.add(uint64(p)*uint64(gm), uint64(perPrice[p]))
	}
	return a.micros()
}
