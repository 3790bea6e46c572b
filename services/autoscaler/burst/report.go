package burst

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// WriteSummary writes the scenario and the comparison of the two pools.
func (r Result) WriteSummary(w io.Writer) error {
	_, err := io.WriteString(w, r.summary())
	return err
}

// WriteTable writes the summary and a table of the run, one row per every.
func (r Result) WriteTable(w io.Writer, every time.Duration) error {
	var b strings.Builder
	b.WriteString(r.summary())
	r.table(&b, every)
	_, err := io.WriteString(w, b.String())
	return err
}

func (r Result) summary() string {
	s := r.Scenario
	var b strings.Builder
	fmt.Fprintf(&b, "Scenario: %s to %s, base %.0f req/s, peak %.0f× base, %d spikes; replica = %d slots × %s mean service (M/M/c), startup %s\n\n",
		s.Start.Format("2006-01-02 15:04 MST"), s.Start.Add(s.Duration).Format("2006-01-02 15:04 MST"), s.BaseRPS,
		s.PeakMultiplier, len(s.Spikes), s.SlotsPerReplica, s.ServiceTime, s.Startup)
	fmt.Fprintf(&b, "| pool | p99 over all requests | worst step p99 | steps over %s | GPU-hours | cost |\n", s.SLO)
	b.WriteString("| --- | --- | --- | --- | --- | --- |\n")
	fmt.Fprintf(&b, "| autoscaled (%d decisions) | %s | %s | %.2f%% | %.0f | %s |\n", r.Decisions, ms(r.P99), ms(r.MaxP99),
		100*r.StepsOverSLO, r.GPUHours, money(r.CostMicros))
	fmt.Fprintf(&b, "| always-on, %d replicas (sized for the peak) | %s | - | - | %.0f | %s |\n", r.AlwaysOnReplicas,
		ms(r.AlwaysOnP99), r.AlwaysOnGPUHours, money(r.AlwaysOnMicros))
	fmt.Fprintf(&b, "\nGPU-hours %.1f%% lower; cost %.1f%% lower (%.1f of the autoscaled GPU-hours on spot at $%.2f, the rest and the always-on pool on-demand at $%.2f).\n\n",
		100*r.GPUHourSaving(), 100*r.CostSaving(), r.SpotGPUHours, float64(s.SpotMicros)/1e6, float64(s.OnDemandMicros)/1e6)
	return b.String()
}

func (r Result) table(b *strings.Builder, every time.Duration) {
	fmt.Fprintf(b, "| period from | max req/s | max replicas | worst p99 |\n| --- | --- | --- | --- |\n")
	var worst time.Duration
	var maxRPS float64
	var first Point
	maxRep := 0
	for i, p := range r.Points {
		if p.At.Sub(r.Points[0].At)%every == 0 {
			first = p
		}
		worst = max(worst, p.P99)
		maxRPS = math.Max(maxRPS, p.RPS)
		maxRep = max(maxRep, p.Requested)
		if i == len(r.Points)-1 || r.Points[i+1].At.Sub(r.Points[0].At)%every == 0 {
			fmt.Fprintf(b, "| %s | %.0f | %d | %s |\n", first.At.Format("01-02 15:04"), maxRPS, maxRep, ms(worst))
			worst, maxRPS, maxRep = 0, 0, 0
		}
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

func money(micros int64) string { return fmt.Sprintf("$%.0f", float64(micros)/1e6) }

// WriteSVG plots load, replicas and p99 over time in three stacked panels.
func (r Result) WriteSVG(w io.Writer) error {
	const W, panelH, left, right, top, gap = 1000.0, 180.0, 70.0, 20.0, 30.0, 40.0
	H := top + 3*panelH + 2*gap + 40
	pts := r.Points
	t0, t1 := pts[0].At, pts[len(pts)-1].At
	x := func(t time.Time) float64 { return left + (W-left-right)*float64(t.Sub(t0))/float64(t1.Sub(t0)) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11">`+"\n", W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="18" font-size="14">618 burst: autoscaled p99 %s (always-on %s), GPU-hours %.0f vs %.0f (%.0f%% lower)</text>`+"\n",
		left, ms(r.P99), ms(r.AlwaysOnP99), r.GPUHours, r.AlwaysOnGPUHours, 100*r.GPUHourSaving())
	type series struct {
		color string
		val   func(Point) float64
	}
	panel := func(i int, title string, ymax float64, ss []series, hline float64) {
		y0 := top + float64(i)*(panelH+gap)
		y := func(v float64) float64 { return y0 + panelH - panelH*math.Min(v, ymax)/ymax }
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#999"/>`+"\n", left, y0, W-left-right, panelH)
		fmt.Fprintf(&b, `<text x="5" y="%.0f">%s</text>`+"\n", y0+12, title)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="end">%.0f</text><text x="%.0f" y="%.0f" text-anchor="end">0</text>`+"\n",
			left-4, y0+10, ymax, left-4, y0+panelH)
		for _, s := range ss {
			b.WriteString(`<polyline fill="none" stroke-width="1" stroke="` + s.color + `" points="`)
			stride := max(1, len(pts)/2000)
			for j := 0; j < len(pts); j += stride {
				v := s.val(pts[j])
				for k := j + 1; k < min(j+stride, len(pts)); k++ {
					v = math.Max(v, s.val(pts[k]))
				}
				fmt.Fprintf(&b, "%.1f,%.1f ", x(pts[j].At), y(v))
			}
			b.WriteString("\"/>\n")
		}
		if hline > 0 {
			fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="red" stroke-dasharray="4 3"/>`+"\n", left, W-right, y(hline), y(hline))
		}
	}
	maxRPS, maxRep := 0.0, float64(r.AlwaysOnReplicas)
	for _, p := range pts {
		maxRPS = math.Max(maxRPS, p.RPS)
		maxRep = math.Max(maxRep, float64(p.Requested))
	}
	panel(0, "req/s", math.Ceil(maxRPS/1000)*1000, []series{{"#1f77b4", func(p Point) float64 { return p.RPS }}}, 0)
	panel(1, "replicas", math.Ceil(maxRep/10)*10, []series{
		{"#2ca02c", func(p Point) float64 { return float64(p.Requested) }},
		{"#ff7f0e", func(p Point) float64 { return float64(r.AlwaysOnReplicas) }},
		{"#9467bd", func(p Point) float64 { return float64(p.SpotReplicas) }},
	}, 0)
	slo := float64(r.Scenario.SLO) / float64(time.Millisecond)
	panel(2, "p99 ms", 2*slo, []series{
		{"#d62728", func(p Point) float64 { return float64(p.P99) / float64(time.Millisecond) }},
		{"#ff7f0e", func(p Point) float64 { return float64(p.AlwaysOnP99) / float64(time.Millisecond) }},
	}, slo)
	yAxis := top + 3*panelH + 2*gap + 15
	tick := 6 * time.Hour
	if t1.Sub(t0) > 48*time.Hour {
		tick = 24 * time.Hour
	}
	for d := t0; !d.After(t1); d = d.Add(tick) {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", x(d), yAxis, d.In(r.Scenario.Zone).Format("01-02 15:04"))
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">green: autoscaled replicas; purple: of which spot; orange: always-on; red dashed: SLO</text>`+"\n", left, yAxis+18)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
