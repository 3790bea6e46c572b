package replay

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// TableLevels are the arrived levels the table shows (FGD.md §1).
var TableLevels = []int{50, 80, 90, 95, 100, 105, 110, 115, 120, 125, 130}

// WriteTable prints, per policy, unallocated GPU % (median and mean over
// seeds) at each level, then fragmentation, failures and wall time at 100 %.
func WriteTable(w io.Writer, sums []Summary) error {
	if _, err := fmt.Fprintln(w, "unallocated GPU % by arrived workload (median over seeds [mean])"); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	levels := TableLevels
	if len(sums) > 0 {
		top := 0
		for _, s := range sums {
			if n := len(s.Levels); n > 0 {
				top = max(top, s.Levels[n-1].Arrived)
			}
		}
		levels = levels[:0:0]
		for _, l := range TableLevels {
			if l <= top {
				levels = append(levels, l)
			}
		}
	}
	head := []string{"policy"}
	for _, l := range levels {
		head = append(head, fmt.Sprintf("%d%%", l))
	}
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	for _, s := range sums {
		row := []string{s.Policy}
		for _, l := range levels {
			if lv, ok := s.Level(l); ok {
				row = append(row, fmt.Sprintf("%.2f [%.2f]", lv.Unalloc.Median, lv.Unalloc.Mean))
			} else {
				row = append(row, "-")
			}
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "at 100% arrived\tunalloc min-max\tunalloc mean±sd\tfrag % cap (median)\tfrag rate % (median)\tfailed tasks (mean)\ttasks (mean)\twall s (mean)\t")
	for _, s := range sums {
		lv, ok := s.Level(100)
		if !ok {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t%.0f\t%.0f\t%.2f\t\n", s.Policy, s.Failed.Mean, s.Tasks.Mean, s.WallSec.Mean)
			continue
		}
		fmt.Fprintf(tw, "%s\t%.2f-%.2f\t%.2f±%.2f\t%.2f\t%.2f\t%.0f\t%.0f\t%.2f\t\n", s.Policy, lv.Unalloc.Min, lv.Unalloc.Max,
			lv.Unalloc.Mean, lv.Unalloc.SD, lv.Frag.Median, lv.FragRate.Median, s.Failed.Mean, s.Tasks.Mean, s.WallSec.Mean)
	}
	return tw.Flush()
}

// Report is the JSON output.
type Report struct {
	Mode     string    `json:"mode"`
	NodeFile string    `json:"node_file"`
	PodFile  string    `json:"pod_file"`
	WallSec  float64   `json:"wall_s"`
	Policies []Summary `json:"policies"`
}

// WriteJSON writes the report, indented.
func WriteJSON(w io.Writer, r Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteSVG plots the median GPU allocation ratio against arrived workload,
// one line per policy, with the ideal max(0, 100−arrived) dashed.
func WriteSVG(w io.Writer, title string, sums []Summary) error {
	const W, H, L, R, T, B = 760.0, 480.0, 60.0, 150.0, 40.0, 50.0
	maxX := 100.0
	for _, s := range sums {
		if n := len(s.Levels); n > 0 {
			maxX = math.Max(maxX, float64(s.Levels[n-1].Arrived))
		}
	}
	px := func(x float64) float64 { return L + x/maxX*(W-L-R) }
	py := func(y float64) float64 { return T + (100-y)/100*(H-T-B) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="22" font-size="14">%s</text>`+"\n", L, xmlEscape(title))
	for v := 0.0; v <= 100; v += 20 {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/><text x="%.1f" y="%.1f" text-anchor="end">%.0f</text>`+"\n",
			L, py(v), W-R, py(v), L-6, py(v)+4, v)
	}
	for v := 0.0; v <= maxX; v += 10 {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/><text x="%.1f" y="%.1f" text-anchor="middle">%.0f</text>`+"\n",
			px(v), T, px(v), H-B, px(v), H-B+16, v)
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">arrived workload (%% of GPU capacity)</text>`+"\n", (L+W-R)/2, H-12)
	fmt.Fprintf(&b, `<text transform="translate(16,%.1f) rotate(-90)" text-anchor="middle">GPU allocation ratio (%%, median over seeds)</text>`+"\n", (T+H-B)/2)
	fmt.Fprintf(&b, `<polyline fill="none" stroke="#999" stroke-dasharray="4 4" points="%.1f,%.1f %.1f,%.1f %.1f,%.1f"/>`+"\n",
		px(0), py(0), px(100), py(100), px(maxX), py(100))
	colours := []string{"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}
	for i, s := range sums {
		c := colours[i%len(colours)]
		var pts []string
		for _, lv := range s.Levels {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(float64(lv.Arrived)), py(lv.Alloc.Median)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", c, strings.Join(pts, " "))
		label := s.Policy
		if lv, ok := s.Level(100); ok {
			label = fmt.Sprintf("%s (%.2f%% unalloc @100)", s.Policy, lv.Unalloc.Median)
		}
		y := T + 10 + float64(i)*18
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"/><text x="%.1f" y="%.1f">%s</text>`+"\n",
			W-R+8, y, W-R+24, y, c, W-R+28, y+4, xmlEscape(label))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func xmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}
