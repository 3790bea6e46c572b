package burst_test

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/autoscaler/burst"
)

func TestErlangCMatchesKnownValues(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		c    int
		a    float64
		want float64
	}{
		// M/M/1: P(wait) = rho.
		{"one server waits with probability rho", 1, 0.7, 0.7},
		// Textbook value: c=2, a=1 (rho 0.5): C = 1/3.
		{"two servers at half load wait a third of the time", 2, 1, 1.0 / 3},
		{"no load never waits", 8, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if got := burst.ErlangC(c.c, c.a); math.Abs(got-c.want) > 1e-9 {
				t.Fatalf("ErlangC(%d, %v) = %v, want %v", c.c, c.a, got, c.want)
			}
		})
	}
}

func TestQueueQuantileOfMM1IsTheExponentialOfTheSpareRate(t *testing.T) {
	t.Parallel()
	// M/M/1 response time is exponential with rate mu - lambda.
	q := burst.NewQueue(70, 100, 1, 0)
	want := math.Log(100) / 30
	if got := q.Quantile(0.99); math.Abs(got-want) > 1e-6 {
		t.Fatalf("p99 %v, want %v", got, want)
	}
	if got := q.Mean(); math.Abs(got-1.0/30) > 1e-9 {
		t.Fatalf("mean %v, want %v", got, 1.0/30)
	}
	// An offset shifts every quantile.
	if got := burst.NewQueue(70, 100, 1, 0.5).Quantile(0.99); math.Abs(got-0.5-want) > 1e-6 {
		t.Fatalf("with offset: %v", got)
	}
}

func TestTheLoadCurveHasABaseARampAPeakAndSpikes(t *testing.T) {
	t.Parallel()
	s := burst.Sale618()
	at := func(d, h, m int) float64 { return s.Load(time.Date(2026, 6, d, h, m, 0, 0, s.Zone)) }
	if b := at(15, 21, 0); math.Abs(b-s.BaseRPS) > 1 {
		t.Fatalf("ordinary evening %v, want the base %v", b, s.BaseRPS)
	}
	if r := at(18, 16, 0); r <= s.BaseRPS*2 || r >= s.BaseRPS*s.PeakMultiplier {
		t.Fatalf("mid-ramp %v", r)
	}
	if p := at(18, 20, 30); math.Abs(p-s.BaseRPS*s.PeakMultiplier) > 1 {
		t.Fatalf("peak %v", p)
	}
	if sp := at(18, 20, 3); sp < s.BaseRPS*s.PeakMultiplier*1.5 {
		t.Fatalf("opening spike %v", sp)
	}
}

func TestTheBurstRunIsReproducibleAndReportsBothPools(t *testing.T) {
	t.Parallel()
	a, err := burst.Run(burst.SaleDay())
	if err != nil {
		t.Fatal(err)
	}
	b, err := burst.Run(burst.SaleDay())
	if err != nil {
		t.Fatal(err)
	}
	if a.P99 != b.P99 || a.GPUHours != b.GPUHours || a.Decisions != b.Decisions {
		t.Fatalf("two runs differ: %v/%v %v/%v", a.P99, b.P99, a.GPUHours, b.GPUHours)
	}
	if a.Decisions == 0 || a.AlwaysOnReplicas == 0 || a.GPUHours <= 0 {
		t.Fatalf("degenerate run: %+v", a)
	}
	// The pool followed the load: it grew at least tenfold from its trough
	// (on the sale day it goes from 2 to 56 replicas).
	lo, hi := math.MaxInt, 0
	for _, p := range a.Points {
		lo, hi = min(lo, p.Requested), max(hi, p.Requested)
	}
	if hi < 10*lo {
		t.Fatalf("replicas ranged %d..%d; the pool did not grow tenfold with the burst", lo, hi)
	}
	// The always-on pool is the smallest meeting the SLO at the peak.
	if a.AlwaysOnP99 > a.Scenario.SLO {
		t.Fatalf("always-on p99 %v above the SLO it was sized for", a.AlwaysOnP99)
	}
	var table bytes.Buffer
	if err := a.WriteTable(&table, 3*time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"autoscaled", "always-on", "GPU-hours", "p99"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q", want)
		}
	}
	t.Logf("\n%s", table.String())
}

func TestTheBurstPlotIsWellFormedSVG(t *testing.T) {
	t.Parallel()
	res, err := burst.Run(burst.SaleDay())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "burst.svg")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.WriteSVG(f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(data))
	polylines := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			polylines++
		}
	}
	if polylines != 6 {
		t.Fatalf("%d polylines, want 6 (load, 3 replica series, 2 latency series)", polylines)
	}
}
