package replay

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"strconv"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// Mode is how tasks are submitted.
type Mode string

// Modes.
const (
	ModeInflation Mode = "inflation"
	ModeTimeline  Mode = "timeline"
)

// ParseMode checks a mode name.
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case ModeInflation, ModeTimeline:
		return Mode(s), nil
	}
	return "", fmt.Errorf("unknown replay mode %q (want inflation or timeline)", s)
}

// DefaultTune is the paper's inflation target: 130 % of GPU capacity.
const DefaultTune = 1.3

// Options configure one run.
type Options struct {
	Mode Mode
	// Tune is the inflation target as a multiple of GPU capacity
	// (inflation mode; 0 = DefaultTune).
	Tune float64
	// MaxSharers per GPU; 0 = unlimited, as in the trace.
	MaxSharers int
	// Stretch multiplies every task's lifetime in timeline mode (0 or 1:
	// as recorded). At the recorded times the default trace never asks for
	// more than ~1.5 % of the cluster at once; stretching lifetimes raises
	// the concurrent load while keeping the arrival order and churn.
	Stretch float64
}

// Event is the cluster state after one task event (placement, failure or,
// in timeline mode, departure), in milli-GPU.
type Event struct {
	Arrived int64   // inflation: GPU request of all tasks submitted so far; timeline: demand in the system
	Used    int64   // allocated milli-GPU
	Frag    float64 // F(M) summed over the cluster
}

// Result is one run: one policy, one seed.
type Result struct {
	Policy   placement.Policy
	Seed     int64
	Capacity int64
	Tasks    int // tasks submitted
	Failed   int // inflation: tasks that found no node; timeline: tasks that left while still pending
	Levels   []Level
	// FinalUsed is the allocated milli-GPU after the last event.
	FinalUsed int64
	// Waited is, in timeline mode, how many tasks had to queue before
	// running.
	Waited int
	Wall   time.Duration
}

// sim holds the cluster and its incrementally kept measures.
type sim struct {
	cluster  placement.Cluster
	index    map[string]int
	meter    placement.FragMeter // F(M) and idle GPU, node by node
	used     int64
	capacity int64
	placer   *placement.Placer
	where    map[string]int // running task → node
	now      time.Time
}

func newSim(tr *Trace, pol placement.Policy, w *placement.Workload, tie []int, maxSharers int) (*sim, error) {
	cat := placement.DefaultCatalogue()
	s := &sim{index: map[string]int{}, where: map[string]int{}, now: time.Unix(0, 0).UTC()}
	if maxSharers <= 0 {
		maxSharers = 1 << 30
	}
	for i, ns := range tr.Nodes {
		n := placement.Node{ID: ns.Name, Ready: true, Market: rent.OnDemand, TieRank: uint64(tie[i]),
			CPUMilli: ns.CPUMilli, MemoryMiB: ns.MemoryMiB, FreeCPUMilli: ns.CPUMilli, FreeMemoryMiB: ns.MemoryMiB}
		vram := int64(32 * 1024)
		if m, ok := cat[ns.Model]; ok && m.VRAMMiB > 0 {
			vram = m.VRAMMiB
		}
		for g := range ns.GPUs {
			n.GPUs = append(n.GPUs, placement.GPU{Index: g, Model: ns.Model, FreeMilli: placement.MilliPerGPU,
				VRAMMiB: vram, FreeVRAMMiB: vram, MaxSharers: maxSharers, NVLinkDomain: -1, PCIeSwitch: g / 2, NUMA: g / 4})
		}
		s.capacity += int64(ns.GPUs) * placement.MilliPerGPU
		s.index[ns.Name] = i
		s.cluster.Nodes = append(s.cluster.Nodes, n)
	}
	s.meter.Reset(&s.cluster, *w)
	p, err := placement.NewPlacer(placement.Options{Policy: pol, Catalogue: cat, Workload: w})
	if err != nil {
		return nil, err
	}
	s.placer = p
	return s, nil
}

func request(p *PodSpec, id string) placement.Request {
	return placement.Request{ID: id, Tenant: "trace", Class: rent.ClassOnDemand, GPUCount: p.GPUs,
		MilliPerGPU: p.GPUMilli, CPUMilli: p.CPUMilli, MemoryMiB: p.MemoryMiB, Models: p.Models}
}

// place tries one task; false when no node fits.
func (s *sim) place(p *PodSpec, id string) (bool, error) {
	r := request(p, id)
	pl, err := s.placer.Place(&s.cluster, &r)
	if err != nil {
		var noFit *placement.NoFitError
		if errors.As(err, &noFit) {
			return false, nil
		}
		return false, fmt.Errorf("task %s: %w", p.Name, err)
	}
	i := s.index[pl.NodeID]
	n := &s.cluster.Nodes[i]
	n.Apply(&r, pl, s.now)
	for _, sh := range pl.GPUs {
		s.used += sh.Milli
	}
	s.where[id] = i
	s.meter.Update(&s.cluster, i)
	return true, nil
}

// remove takes a running task off its node.
func (s *sim) remove(id string) {
	i, ok := s.where[id]
	if !ok {
		return
	}
	n := &s.cluster.Nodes[i]
	for _, a := range n.Allocations {
		if a.RentalID == id {
			for _, sh := range a.GPUs {
				s.used -= sh.Milli
			}
		}
	}
	n.Remove(id)
	delete(s.where, id)
	s.meter.Update(&s.cluster, i)
}

// TargetWorkload is the fragmentation measure's M for a trace: the
// popular shapes of the original pods (FGD.md §2.1).
func TargetWorkload(pods []PodSpec) placement.Workload {
	shapes := make([]placement.TaskShape, len(pods))
	for i := range pods {
		shapes[i] = pods[i].Shape()
	}
	return placement.NewWorkload(shapes, placement.DefaultCoveragePct)
}

// Inflate is the paper's task sequence for a seed (FGD.md §3 steps 3–5):
// pods sorted by name and shuffled, then clones drawn uniformly with
// replacement from the sorted pods until the GPU request would pass tune ×
// capacity (the simulator's stop test compares the running total plus the
// clone's per-GPU milli). It also returns the node tie order, a seeded
// permutation (lower wins).
func Inflate(tr *Trace, seed int64, tune float64) (seq []PodSpec, tie []int) {
	rng := rand.New(rand.NewSource(seed))
	sorted := slices.Clone(tr.Pods)
	slices.SortFunc(sorted, func(a, b PodSpec) int { return cmp.Compare(a.Name, b.Name) })
	_ = rng.Int() // the simulator draws one Int before shuffling
	seq = slices.Clone(sorted)
	rng.Shuffle(len(seq), func(i, j int) { seq[i], seq[j] = seq[j], seq[i] })
	var total int64
	for i := range seq {
		total += seq[i].GPURequest()
	}
	target := int64(tune * float64(tr.CapacityMilli()))
	for k := 0; ; k++ {
		c := sorted[rng.Intn(len(sorted))]
		if total+c.GPUMilli > target {
			break
		}
		c.Name = c.Name + "-clone-" + strconv.Itoa(k)
		total += c.GPURequest()
		seq = append(seq, c)
	}
	return seq, rng.Perm(len(tr.Nodes))
}

// Run replays the trace under one policy and seed.
func Run(tr *Trace, pol placement.Policy, seed int64, o Options) (Result, error) {
	start := time.Now()
	if o.Mode == "" {
		o.Mode = ModeInflation
	}
	if o.Tune <= 0 {
		o.Tune = DefaultTune
	}
	w := TargetWorkload(tr.Pods)
	res := Result{Policy: pol, Seed: seed}
	var bins binner
	var err error
	switch o.Mode {
	case ModeInflation:
		err = runInflation(tr, pol, seed, o, &w, &res, &bins)
	case ModeTimeline:
		err = runTimeline(tr, pol, seed, o, &w, &res, &bins)
	default:
		_, err = ParseMode(string(o.Mode))
	}
	if err != nil {
		return Result{}, err
	}
	res.Levels = bins.levels()
	res.Wall = time.Since(start)
	return res, nil
}

func runInflation(tr *Trace, pol placement.Policy, seed int64, o Options, w *placement.Workload, res *Result, bins *binner) error {
	seq, tie := Inflate(tr, seed, o.Tune)
	s, err := newSim(tr, pol, w, tie, o.MaxSharers)
	if err != nil {
		return err
	}
	res.Capacity = s.capacity
	var arrived int64
	prefix := "s" + strconv.FormatInt(seed, 10) + "-"
	for i := range seq {
		p := &seq[i]
		arrived += p.GPURequest()
		ok, err := s.place(p, prefix+strconv.Itoa(i))
		if err != nil {
			return err
		}
		if !ok {
			res.Failed++
		}
		bins.add(s.capacity, Event{Arrived: arrived, Used: s.used, Frag: s.meter.Stats().FragMilli})
	}
	res.Tasks = len(seq)
	res.FinalUsed = s.used
	return nil
}

// runTimeline replays creation and deletion times with a pending queue,
// retried in arrival order whenever a task leaves. The seed only orders the nodes for ties (and random's draws).
func runTimeline(tr *Trace, pol placement.Policy, seed int64, o Options, w *placement.Workload, res *Result, bins *binner) error {
	for i := range tr.Pods {
		if !tr.Pods[i].HasTimes {
			return fmt.Errorf("timeline mode needs creation_time and deletion_time; pod %s has none (the multigpu variants carry no times)", tr.Pods[i].Name)
		}
	}
	rng := rand.New(rand.NewSource(seed))
	s, err := newSim(tr, pol, w, rng.Perm(len(tr.Nodes)), o.MaxSharers)
	if err != nil {
		return err
	}
	res.Capacity = s.capacity
	// At one second: departures of older tasks, then arrivals, then
	// departures of tasks that arrived that same second (zero lifetime).
	type event struct {
		t      int64
		kind   int // 0 older departure, 1 arrival, 2 same-second departure
		pod    int
		arrive bool
	}
	evs := make([]event, 0, 2*len(tr.Pods))
	for i, p := range tr.Pods {
		end := p.Deleted
		if o.Stretch > 0 && o.Stretch != 1 {
			end = p.Created + int64(float64(p.Deleted-p.Created)*o.Stretch)
		}
		kind := 0
		if end == p.Created {
			kind = 2
		}
		evs = append(evs, event{p.Created, 1, i, true}, event{end, kind, i, false})
	}
	slices.SortFunc(evs, func(a, b event) int {
		return cmp.Or(cmp.Compare(a.t, b.t), cmp.Compare(a.kind, b.kind), cmp.Compare(a.pod, b.pod))
	})
	var pending []int
	waited := map[int]bool{}
	var demand int64
	id := func(i int) string { return tr.Pods[i].Name }
	for _, e := range evs {
		p := &tr.Pods[e.pod]
		s.now = time.Unix(e.t, 0).UTC()
		if e.arrive {
			demand += p.GPURequest()
			res.Tasks++
			ok, err := s.place(p, id(e.pod))
			if err != nil {
				return err
			}
			if !ok {
				pending = append(pending, e.pod)
				waited[e.pod] = true
			}
		} else {
			demand -= p.GPURequest()
			if _, running := s.where[id(e.pod)]; running {
				s.remove(id(e.pod))
			} else if k := slices.Index(pending, e.pod); k >= 0 {
				pending = slices.Delete(pending, k, k+1)
				res.Failed++
			}
			// Retry the queue in arrival order; whatever fits now runs
			// (a task that still waits does not block smaller ones).
			kept := pending[:0]
			for _, q := range pending {
				ok, err := s.place(&tr.Pods[q], id(q))
				if err != nil {
					return err
				}
				if !ok {
					kept = append(kept, q)
				}
			}
			pending = kept
		}
		bins.add(s.capacity, Event{Arrived: demand, Used: s.used, Frag: s.meter.Stats().FragMilli})
	}
	res.Waited = len(waited)
	res.FinalUsed = s.used
	return nil
}
