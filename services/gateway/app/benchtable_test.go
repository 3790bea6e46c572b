package app_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// row is one line of a benchmark's table: a measured value (ms, or a
// ratio when it has no unit), its goal, and the bare operation it is
// compared with (bare 0: none).
type row struct {
	what     string
	value    float64
	goal     string
	bare     float64
	bareWhat string
}

// printTable logs rows as a table; verdict[i], when present, is row i's
// PASS or MISS.
func printTable(_ *testing.B, rows []row, verdict map[int]bool) {
	var s strings.Builder
	fmt.Fprintf(&s, "\n%-62s %10s %10s %22s %s\n", "measured", "value", "goal", "ratio to bare", "verdict")
	for i, r := range rows {
		ratio := ""
		if r.bare > 0 {
			ratio = fmt.Sprintf("%.1fx %s", r.value/r.bare, r.bareWhat)
		}
		v := ""
		if pass, ok := verdict[i]; ok {
			v = map[bool]string{true: "PASS", false: "MISS"}[pass]
		}
		unit := " ms"
		switch {
		case strings.Contains(r.what, "ratio"):
			unit = "x "
		case strings.Contains(r.what, "failed"):
			unit = "  "
		}
		fmt.Fprintf(&s, "%-62s %7.3f%s %10s %22s %s\n", r.what, r.value, unit, r.goal, ratio, v)
	}
	// On stdout, not b.Log: a benchmark's log is cut after ten lines.
	fmt.Print(s.String())
}

// ms is the p-quantile of ds in milliseconds.
func ms(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[int(p*float64(len(s)-1))].Microseconds()) / 1000
}
