package placement

import (
	"cmp"
	"math"
	"slices"
	"strings"
)

// TaskShape is the key of the fragmentation measure's target workload: a
// task's CPU, GPU count, milli-GPU per GPU and allowed models (memory is not
// part of it). A CPU-only task has GPUs 0 and Milli 0.
type TaskShape struct {
	CPUMilli int64
	GPUs     int
	Milli    int64
	// Models is the "|"-joined list of allowed models, empty for any.
	Models string
}

// TaskClass is one shape of the target workload with its popularity p_m.
type TaskClass struct {
	TaskShape
	Weight float64
	models []string
}

// Workload is the target workload M: the popular task shapes with their
// probabilities (summing to 1).
type Workload struct {
	Classes []TaskClass
}

// DefaultCoveragePct is the simulator's podPopularityThreshold: the most
// popular shapes are kept until they cover 95 % of the tasks.
const DefaultCoveragePct = 95

// NewWorkload computes M from observed tasks as the FGD simulator's
// GetTypicalPods does: count each shape, sort by count (ties by CPU, milli,
// GPU count and models, all descending), keep shapes from the top until
// their cumulative count reaches coveragePct of all tasks, and renormalise
// the kept counts to probabilities.
func NewWorkload(tasks []TaskShape, coveragePct int) Workload {
	counts := map[TaskShape]int{}
	for _, t := range tasks {
		counts[t]++
	}
	return WorkloadFromCounts(counts, coveragePct)
}

// WorkloadFromCounts is NewWorkload from shape counts.
func WorkloadFromCounts(counts map[TaskShape]int, coveragePct int) Workload {
	type kc struct {
		k TaskShape
		n int
	}
	var all []kc
	total := 0
	for k, n := range counts {
		if n > 0 {
			all = append(all, kc{k, n})
			total += n
		}
	}
	slices.SortFunc(all, func(a, b kc) int {
		return -cmp.Or(cmp.Compare(a.n, b.n), cmp.Compare(a.k.CPUMilli, b.k.CPUMilli),
			cmp.Compare(a.k.Milli, b.k.Milli), cmp.Compare(a.k.GPUs, b.k.GPUs), strings.Compare(a.k.Models, b.k.Models))
	})
	var w Workload
	kept := 0
	for _, e := range all {
		if kept*100 >= coveragePct*total {
			break
		}
		kept += e.n
		w.Classes = append(w.Classes, TaskClass{TaskShape: e.k, Weight: float64(e.n)})
	}
	for i := range w.Classes {
		w.Classes[i].Weight /= float64(kept)
		if m := w.Classes[i].Models; m != "" {
			w.Classes[i].models = strings.Split(m, "|")
		}
	}
	return w
}

// ShapeOf is the task shape of a request (d = 1000 for whole GPUs; a MIG
// request counts as the milli-GPU of its slice).
func ShapeOf(r *Request) TaskShape {
	milli := r.MilliPerGPU
	if prof, ok := ParseMIGProfile(r.MIGProfile); ok {
		milli = prof.Milli()
	}
	return TaskShape{CPUMilli: r.CPUMilli, GPUs: r.GPUCount, Milli: milli, Models: strings.Join(r.Models, "|")}
}

// fragState is the part of a node the measure reads: free CPU, model and
// the free milli-GPU of each GPU.
type fragState struct {
	cpu   int64
	model string
	free  []int64
}

func stateOf(n *Node, buf []int64) fragState {
	buf = buf[:0]
	for i := range n.GPUs {
		buf = append(buf, n.GPUs[i].FreeMilli)
	}
	return fragState{cpu: n.FreeCPUMilli, model: n.model(), free: buf}
}

// taskFrag is F_n(m), the fragment (milli-GPU) of a node as seen by one
// task shape (FGD simulator, NodeGpuShareFragAmount):
//   - a CPU-only task, or one that may not use the node's model: all idle
//     GPU R_n is fragment;
//   - a task that fits (at least k GPUs with f >= d, and the CPU): the
//     GPUs individually too small for it are fragment;
//   - a task that does not fit: all of R_n.
func taskFrag(s fragState, m *TaskClass) int64 {
	var total, small int64
	fit := 0
	for _, f := range s.free {
		total += f
		if m.GPUs > 0 && f >= m.Milli {
			fit++
		} else {
			small += f
		}
	}
	if m.GPUs == 0 || (len(m.models) > 0 && !slices.Contains(m.models, s.model)) {
		return total
	}
	if fit >= m.GPUs && s.cpu >= m.CPUMilli {
		return small
	}
	return total
}

// frag is F_n(M) = Σ p_m F_n(m).
func (w *Workload) frag(s fragState) float64 {
	var f float64
	for i := range w.Classes {
		f += w.Classes[i].Weight * float64(taskFrag(s, &w.Classes[i]))
	}
	return f
}

// fgdScore is the FGD node score for a fragment reduction delta (milli):
// int64(100·sigmoid(delta/1000)), as the simulator's fgd_score plugin.
func fgdScore(delta float64) int64 {
	return int64(100 / (1 + math.Exp(-delta/1000)))
}

// classParts is what F_n(m) needs of a node for one class: idle milli,
// the milli of GPUs too small for the class, and how many GPUs fit it.
type classParts struct {
	total, small int64
	fit          int
}

// fgdScratch holds one node's per-class parts and F_n(M), so each
// candidate GPU set is scored in O(classes × GPUs changed).
type fgdScratch struct {
	parts  []classParts
	before float64
}

func (w *Workload) prepare(n *Node, sc *fgdScratch) {
	sc.parts = sc.parts[:0]
	sc.before = 0
	for i := range w.Classes {
		m := &w.Classes[i]
		var p classParts
		for g := range n.GPUs {
			f := n.GPUs[g].FreeMilli
			p.total += f
			if m.GPUs > 0 && f >= m.Milli {
				p.fit++
			} else {
				p.small += f
			}
		}
		sc.parts = append(sc.parts, p)
		sc.before += m.Weight * float64(partsFrag(p, m, n.FreeCPUMilli, n.model()))
	}
}

// partsFrag is taskFrag from a class's parts.
func partsFrag(p classParts, m *TaskClass, cpu int64, model string) int64 {
	if m.GPUs == 0 || (len(m.models) > 0 && !slices.Contains(m.models, model)) {
		return p.total
	}
	if p.fit >= m.GPUs && cpu >= m.CPUMilli {
		return p.small
	}
	return p.total
}

// deltaAfter is FGD's Δ: F_n(M) before minus after taking shares and cpu
// from a prepared node (milli-GPU; positive when fragmentation falls).
func (w *Workload) deltaAfter(n *Node, sc *fgdScratch, cpu int64, shares []Share) float64 {
	var after float64
	model := n.model()
	for i := range w.Classes {
		m := &w.Classes[i]
		p := sc.parts[i]
		for _, s := range shares {
			f := n.GPUs[s.Index].FreeMilli
			g := f - s.Milli
			p.total += g - f
			if m.GPUs > 0 && f >= m.Milli {
				p.fit--
			} else {
				p.small -= f
			}
			if m.GPUs > 0 && g >= m.Milli {
				p.fit++
			} else {
				p.small += g
			}
		}
		after += m.Weight * float64(partsFrag(p, m, n.FreeCPUMilli-cpu, model))
	}
	return sc.before - after
}

// Window keeps the shapes of the most recent requests and the workload they
// make, for FGD to measure fragmentation against what is being asked now.
type Window struct {
	ring   []TaskShape
	next   int
	full   bool
	counts map[TaskShape]int
	// every is how many additions trigger a recomputation.
	every, since int
	coverage     int
	current      Workload
	gen          uint64
}

// NewWindow keeps the last size shapes and recomputes the workload every
// `every` additions.
func NewWindow(size, every int) *Window {
	return &Window{ring: make([]TaskShape, size), counts: map[TaskShape]int{}, every: max(1, every), coverage: DefaultCoveragePct}
}

// Add records one request's shape.
func (w *Window) Add(s TaskShape) {
	if w.full {
		old := w.ring[w.next]
		if w.counts[old]--; w.counts[old] == 0 {
			delete(w.counts, old)
		}
	}
	w.ring[w.next] = s
	w.counts[s]++
	w.next++
	if w.next == len(w.ring) {
		w.next, w.full = 0, true
	}
	if w.since++; w.since >= w.every || len(w.current.Classes) == 0 {
		w.since = 0
		w.current = WorkloadFromCounts(w.counts, w.coverage)
		w.gen++
	}
}

// Generation counts the workload's recomputations: a new value means
// Workload changed.
func (w *Window) Generation() uint64 { return w.gen }

// Workload is the current target workload (empty before the first Add).
func (w *Window) Workload() Workload { return w.current }
