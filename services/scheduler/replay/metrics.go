package replay

import (
	"math"
	"slices"
)

// Level is the cluster at one arrived-workload level, in % of GPU
// capacity: the mean over the events of that level's bin.
type Level struct {
	Arrived int `json:"arrived_pct"`
	// Alloc is the GPU allocation ratio, Unalloc = 100 − Alloc.
	Alloc   float64 `json:"alloc_pct"`
	Unalloc float64 `json:"unalloc_pct"`
	// Frag is the fragmentation amount F(M) in % of capacity; FragRate is
	// F(M) in % of idle GPU.
	Frag     float64 `json:"frag_pct"`
	FragRate float64 `json:"frag_rate_pct"`
	Events   int     `json:"events"`
}

type bin struct {
	n                     int
	alloc, frag, fragRate float64
}

// binner groups events by round(100·arrived/capacity), rounding half to
// even as pandas does (FGD.md §3 step 8).
type binner struct{ bins []bin }

func (b *binner) add(capacity int64, e Event) {
	if capacity <= 0 {
		return
	}
	level := int(math.RoundToEven(100 * float64(e.Arrived) / float64(capacity)))
	if level < 0 {
		level = 0
	}
	for len(b.bins) <= level {
		b.bins = append(b.bins, bin{})
	}
	x := &b.bins[level]
	x.n++
	x.alloc += 100 * float64(e.Used) / float64(capacity)
	x.frag += 100 * e.Frag / float64(capacity)
	if idle := capacity - e.Used; idle > 0 {
		x.fragRate += 100 * e.Frag / float64(idle)
	}
}

// levels are the bins' means; an empty bin takes the mean over the events
// of its neighbours (L−1..L+1), as the paper's analysis does.
func (b *binner) levels() []Level {
	out := make([]Level, 0, len(b.bins))
	for l := range b.bins {
		x := b.bins[l]
		if x.n == 0 {
			for _, k := range []int{l - 1, l + 1} {
				if k >= 0 && k < len(b.bins) {
					y := b.bins[k]
					x.n, x.alloc, x.frag, x.fragRate = x.n+y.n, x.alloc+y.alloc, x.frag+y.frag, x.fragRate+y.fragRate
				}
			}
			if x.n == 0 {
				continue
			}
			x.n = -x.n // marks an interpolated level (Events 0)
		}
		n := float64(max(x.n, -x.n))
		lv := Level{Arrived: l, Alloc: x.alloc / n, Frag: x.frag / n, FragRate: x.fragRate / n, Events: max(x.n, 0)}
		lv.Unalloc = 100 - lv.Alloc
		out = append(out, lv)
	}
	return out
}

// At returns the level at arrived % l, false when the run did not reach it.
func (r *Result) At(l int) (Level, bool) {
	i, ok := slices.BinarySearchFunc(r.Levels, l, func(x Level, l int) int { return x.Arrived - l })
	if !ok {
		return Level{}, false
	}
	return r.Levels[i], true
}

// Stat is a metric over seeds.
type Stat struct {
	Median float64 `json:"median"`
	Mean   float64 `json:"mean"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	SD     float64 `json:"sd"`
}

// statOf summarises values (empty: zero Stat).
func statOf(v []float64) Stat {
	if len(v) == 0 {
		return Stat{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	var st Stat
	st.Min, st.Max = s[0], s[len(s)-1]
	if n := len(s); n%2 == 1 {
		st.Median = s[n/2]
	} else {
		st.Median = (s[n/2-1] + s[n/2]) / 2
	}
	for _, x := range s {
		st.Mean += x
	}
	st.Mean /= float64(len(s))
	if len(s) > 1 {
		var ss float64
		for _, x := range s {
			ss += (x - st.Mean) * (x - st.Mean)
		}
		st.SD = math.Sqrt(ss / float64(len(s)-1))
	}
	return st
}

// LevelStat is one arrived level over seeds.
type LevelStat struct {
	Arrived  int  `json:"arrived_pct"`
	Seeds    int  `json:"seeds"`
	Alloc    Stat `json:"alloc_pct"`
	Unalloc  Stat `json:"unalloc_pct"`
	Frag     Stat `json:"frag_pct"`
	FragRate Stat `json:"frag_rate_pct"`
}

// Summary is one policy over seeds.
type Summary struct {
	Policy   string      `json:"policy"`
	Seeds    []int64     `json:"seeds"`
	Tasks    Stat        `json:"tasks"`
	Failed   Stat        `json:"failed"`
	WallSec  Stat        `json:"wall_s"`
	Levels   []LevelStat `json:"levels"`
	Waited   Stat        `json:"waited,omitzero"`
	Capacity int64       `json:"capacity_milli_gpu"`
}

// Summarise aggregates the runs of one policy.
func Summarise(runs []Result) Summary {
	var s Summary
	if len(runs) == 0 {
		return s
	}
	s.Policy = string(runs[0].Policy)
	s.Capacity = runs[0].Capacity
	var tasks, failed, wall, waited []float64
	top := 0
	for _, r := range runs {
		s.Seeds = append(s.Seeds, r.Seed)
		tasks = append(tasks, float64(r.Tasks))
		failed = append(failed, float64(r.Failed))
		wall = append(wall, r.Wall.Seconds())
		waited = append(waited, float64(r.Waited))
		if n := len(r.Levels); n > 0 {
			top = max(top, r.Levels[n-1].Arrived)
		}
	}
	s.Tasks, s.Failed, s.WallSec = statOf(tasks), statOf(failed), statOf(wall)
	if w := statOf(waited); w.Max > 0 {
		s.Waited = w
	}
	for l := 0; l <= top; l++ {
		var a, u, f, fr []float64
		for i := range runs {
			if lv, ok := runs[i].At(l); ok {
				a, u, f, fr = append(a, lv.Alloc), append(u, lv.Unalloc), append(f, lv.Frag), append(fr, lv.FragRate)
			}
		}
		if len(a) == 0 {
			continue
		}
		s.Levels = append(s.Levels, LevelStat{Arrived: l, Seeds: len(a), Alloc: statOf(a), Unalloc: statOf(u), Frag: statOf(f), FragRate: statOf(fr)})
	}
	return s
}

// Level returns the summary at arrived % l.
func (s *Summary) Level(l int) (LevelStat, bool) {
	for _, x := range s.Levels {
		if x.Arrived == l {
			return x, true
		}
	}
	return LevelStat{}, false
}
