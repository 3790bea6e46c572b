package placement

import (
	"cmp"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"

	"github.com/shizu-gpu/shizu/shared/rent"
)

// Reason names the filter that turned a node away.
type Reason string

// Filter reasons, in the order the filters run.
const (
	ReasonNotReady   Reason = "node not ready"
	ReasonZone       Reason = "zone"
	ReasonMarket     Reason = "market"
	ReasonTEE        Reason = "no TEE"
	ReasonModel      Reason = "GPU model"
	ReasonCapability Reason = "GPU capability"
	ReasonSpotPrice  Reason = "spot price above the maximum"
	ReasonCPU        Reason = "host CPU"
	ReasonMemory     Reason = "host memory"
	ReasonGPUs       Reason = "GPUs"
)

// Filter is one feasibility check of a node for a request.
type Filter struct {
	Reason Reason
	// Static filters look only at what a node is, not at what it has free:
	// a node they turn away could never take the request.
	Static bool
	OK     func(c Catalogue, r *Request, n *Node) bool
}

// Filters is the feasibility chain, in order. The GPU check comes last: it
// also chooses the GPUs.
var Filters = []Filter{
	{ReasonNotReady, false, func(_ Catalogue, _ *Request, n *Node) bool { return n.Ready }},
	{ReasonZone, true, func(_ Catalogue, r *Request, n *Node) bool { return r.Zone == "" || r.Zone == n.Zone }},
	{ReasonMarket, true, func(_ Catalogue, r *Request, n *Node) bool { return r.Market == rent.AnyMarket || r.Market == n.Market }},
	{ReasonTEE, true, func(_ Catalogue, r *Request, n *Node) bool { return !r.TEE || n.TEE }},
	{ReasonModel, true, func(_ Catalogue, r *Request, n *Node) bool {
		return len(r.Models) == 0 || slices.Contains(r.Models, n.model())
	}},
	{ReasonCapability, true, func(c Catalogue, r *Request, n *Node) bool {
		for _, capability := range r.Capabilities {
			if !c.Has(n.model(), capability) {
				return false
			}
		}
		return true
	}},
	// Not static: the spot price moves, a node above the cap now may be
	// under it later.
	{ReasonSpotPrice, false, func(_ Catalogue, r *Request, n *Node) bool { return r.SpotPriceFits(n) }},
	{ReasonCPU, false, func(_ Catalogue, r *Request, n *Node) bool { return n.FreeCPUMilli >= r.CPUMilli }},
	{ReasonMemory, false, func(_ Catalogue, r *Request, n *Node) bool { return n.FreeMemoryMiB >= r.MemoryMiB }},
}

// Policy names a ranking.
type Policy string

// Policies.
const (
	// PolicyFGD ranks by Fragmentation Gradient Descent: the node whose
	// expected fragmentation under the target workload grows least.
	PolicyFGD Policy = "fgd"
	// PolicyBestFit ranks by least remaining CPU and GPU (simulator's
	// best_fit_score, min-max normalised).
	PolicyBestFit Policy = "bestfit"
	// PolicyFirstFit takes the first feasible node in cluster order.
	PolicyFirstFit Policy = "firstfit"
	// PolicyRandom takes a uniformly random feasible node and GPU, seeded
	// from the request id.
	PolicyRandom Policy = "random"
	// PolicyDotProduct ranks by the dot product of free and asked
	// resources (simulator's dot_product_score).
	PolicyDotProduct Policy = "dotprod"
	// PolicyFixed does not share GPUs: every request is rounded up to
	// whole GPUs, then placed best-fit.
	PolicyFixed Policy = "fixed"
	// PolicyShizu is FGD aware of CPU and of scarce GPU models (shizu.go).
	PolicyShizu Policy = "shizu"
)

// Policies lists every policy.
var Policies = []Policy{PolicyFGD, PolicyBestFit, PolicyFirstFit, PolicyRandom, PolicyDotProduct, PolicyFixed, PolicyShizu, PolicyGPUPacking, PolicyGPUClustering}

// ParsePolicy checks a policy name.
func ParsePolicy(s string) (Policy, error) {
	if slices.Contains(Policies, Policy(s)) {
		return Policy(s), nil
	}
	return "", fmt.Errorf("unknown placement policy %q (want one of %v)", s, Policies)
}

// Options configure a Placer.
type Options struct {
	Policy    Policy
	Catalogue Catalogue
	// Workload is FGD's target workload; with none, FGD falls back to
	// measuring against the request's own shape.
	Workload *Workload
	// MaxCandidates, when > 0, stops the scan once that many feasible
	// nodes are found, starting at a node chosen by the request id (Nomad's
	// limit iterator): decisions then cost O(MaxCandidates) instead of
	// O(nodes) on a roomy cluster, at some cost in packing quality. 0 scores
	// every node, as the paper's simulator does.
	MaxCandidates int
	// NormCPUMilli and NormGPUMilli normalise best-fit and dot-product
	// (the simulator uses 128 cores and 8 GPUs).
	NormCPUMilli, NormGPUMilli int64
}

// Placer makes placement decisions. It is not safe for concurrent use.
type Placer struct {
	opts Options
	// scratch
	cands []candidate
	fgd   fgdScratch
	shizu shizuScratch
}

// NewPlacer returns a placer; the zero Options are FGD on the default
// catalogue.
func NewPlacer(o Options) (*Placer, error) {
	if o.Policy == "" {
		o.Policy = PolicyFGD
	}
	if _, err := ParsePolicy(string(o.Policy)); err != nil {
		return nil, err
	}
	if o.Catalogue == nil {
		o.Catalogue = DefaultCatalogue()
	}
	if o.NormCPUMilli <= 0 {
		o.NormCPUMilli = 128_000
	}
	if o.NormGPUMilli <= 0 {
		o.NormGPUMilli = 8 * MilliPerGPU
	}
	return &Placer{opts: o}, nil
}

// Catalogue is the catalogue the placer matches models against.
func (p *Placer) Catalogue() Catalogue { return p.opts.Catalogue }

// SetWorkload replaces FGD's target workload.
func (p *Placer) SetWorkload(w *Workload) { p.opts.Workload = w }

// ErrNoFit: no node can take the request now. The error is a *NoFitError.
var ErrNoFit = errors.New("no node fits")

// NoFitError says how many nodes each filter turned away.
type NoFitError struct {
	Rejected map[Reason]int
	// Feasible is false when no node could take the request even empty
	// (every node failed a static filter or has too few GPUs in all).
	Feasible bool
}

func (e *NoFitError) Error() string {
	return fmt.Sprintf("%v: nodes turned away by %v", ErrNoFit, e.Rejected)
}

// Unwrap returns ErrNoFit.
func (e *NoFitError) Unwrap() error { return ErrNoFit }

type candidate struct {
	node   int
	shares []Share
	score  int64
	tie    uint64
	// preferred: the node's GPUs are of one of Request.PreferredModels.
	preferred bool
}

// shape is the request as placed: fixed rounds fractions up.
type shape struct {
	count int
	milli int64
	vram  int64 // per GPU for a fraction; whole GPUs take all their VRAM
	whole bool
	mig   MIGProfile
	isMIG bool
	cpu   int64
}

func (p *Placer) shapeOf(r *Request) shape {
	s := shape{count: r.GPUCount, milli: r.MilliPerGPU, vram: r.VRAMMiB, cpu: r.CPUMilli}
	if prof, ok := ParseMIGProfile(r.MIGProfile); ok {
		s.mig, s.isMIG = prof, true
		s.milli, s.vram = prof.Milli(), prof.VRAMMiB
		return s
	}
	if p.opts.Policy == PolicyFixed {
		s.milli = MilliPerGPU
	}
	s.whole = s.milli == MilliPerGPU
	return s
}

// usable reports whether GPU g can take one GPU of shape s, and the share.
func usable(g *GPU, s *shape) (Share, bool) {
	if g.Unhealthy || g.Sharers >= g.EffectiveMaxSharers() {
		return Share{}, false
	}
	switch {
	case s.isMIG:
		// Only a GPU in MIG mode, on a free instance of exactly this
		// profile: the node agent runs a rental on an instance that
		// exists, it does not create one.
		if !g.MIGEnabled || g.FreeMilli < s.milli || g.FreeVRAMMiB < s.vram {
			return Share{}, false
		}
		for k := range g.MIGInstances {
			if m := &g.MIGInstances[k]; m.Holder == "" && m.Profile == s.mig.Name {
				return Share{Index: g.Index, Milli: s.milli, VRAMMiB: s.vram, MIGProfile: s.mig.Name, MIGInstance: m.UUID}, true
			}
		}
		return Share{}, false
	case s.whole:
		if g.MIGEnabled || !g.Whole() || s.vram > g.VRAMMiB {
			return Share{}, false
		}
		return Share{Index: g.Index, Milli: MilliPerGPU, VRAMMiB: g.VRAMMiB}, true
	default:
		if g.MIGEnabled || g.MIGSlices > 0 || g.FreeMilli < s.milli || g.FreeVRAMMiB < s.vram {
			return Share{}, false
		}
		return Share{Index: g.Index, Milli: s.milli, VRAMMiB: s.vram}, true
	}
}

// Place decides where request r goes in cluster c: filters, GPU choice,
// ranking, selection. It returns a *NoFitError when no node fits. The
// cluster is not changed; apply the placement with Node.Apply.
func (p *Placer) Place(c *Cluster, r *Request) (Placement, error) {
	if err := r.Validate(p.opts.Catalogue); err != nil {
		return Placement{}, err
	}
	s := p.shapeOf(r)
	if p.opts.Policy == PolicyShizu {
		p.shizu.observe(c, r, p.workload(&s))
	}
	var seed uint64
	if p.opts.Policy == PolicyRandom {
		seed = hashString(r.ID)
	}
	var rejected [16]int // by filter index; len(Filters) is the GPU check
	feasible := false
	p.cands = p.cands[:0]
	offset := 0
	if p.opts.MaxCandidates > 0 && p.opts.Policy != PolicyFirstFit && len(c.Nodes) > 0 {
		offset = int(hashString(r.ID) % uint64(len(c.Nodes)))
	}
	havePref := false // a candidate of a preferred model was found
	for k := range c.Nodes {
		full := p.opts.MaxCandidates > 0 && len(p.cands) >= p.opts.MaxCandidates
		if full && (len(r.PreferredModels) == 0 || havePref) {
			break
		}
		i := k + offset
		if i >= len(c.Nodes) {
			i -= len(c.Nodes)
		}
		n := &c.Nodes[i]
		pref := len(r.PreferredModels) > 0 && slices.Contains(r.PreferredModels, n.model())
		if full && !pref {
			continue // past the limit only a node of a preferred model joins
		}
		if k, ok := p.filter(r, n); !ok {
			rejected[k]++
			continue
		}
		if len(n.GPUs) >= s.count {
			feasible = true
		}
		shares, score, ok := p.chooseGPUs(n, r, &s, seed)
		if !ok {
			rejected[len(Filters)]++
			continue
		}
		p.cands = append(p.cands, candidate{node: i, shares: shares, score: score, preferred: pref})
		havePref = havePref || pref
	}
	if !feasible {
		// Static filters passed nowhere, or no node has enough GPUs: check
		// whether some node could hold it empty.
		for i := range c.Nodes {
			if p.staticFit(r, &c.Nodes[i], s.count) {
				feasible = true
				break
			}
		}
	}
	if len(p.cands) == 0 {
		rej := map[Reason]int{}
		for k, n := range rejected[:len(Filters)+1] {
			if n > 0 {
				reason := ReasonGPUs
				if k < len(Filters) {
					reason = Filters[k].Reason
				}
				rej[reason] += n
			}
		}
		return Placement{}, &NoFitError{Rejected: rej, Feasible: feasible}
	}
	p.rank(c, r, &s, seed)
	best := p.cands[0]
	for _, cd := range p.cands[1:] {
		if better(cd, best, c) {
			best = cd
		}
	}
	n := &c.Nodes[best.node]
	return Placement{
		NodeID: n.ID, Epoch: n.Epoch, CPUMilli: r.CPUMilli, MemoryMiB: r.MemoryMiB,
		GPUs: p.finalGPUs(n, r, &s, best.shares), Model: n.model(), Score: best.score,
	}, nil
}

// filter runs the chain; on refusal it returns the failing filter's index.
func (p *Placer) filter(r *Request, n *Node) (int, bool) {
	for i := range Filters {
		if !Filters[i].OK(p.opts.Catalogue, r, n) {
			return i, false
		}
	}
	return 0, true
}

func (p *Placer) staticFit(r *Request, n *Node, count int) bool {
	for i := range Filters {
		if Filters[i].Static && !Filters[i].OK(p.opts.Catalogue, r, n) {
			return false
		}
	}
	return len(n.GPUs) >= count && n.CPUMilli >= r.CPUMilli && n.MemoryMiB >= r.MemoryMiB
}

func better(a, b candidate, c *Cluster) bool {
	if a.preferred != b.preferred {
		return a.preferred // a preferred model ranks above any score
	}
	if a.score != b.score {
		return a.score > b.score
	}
	ra, rb := c.Nodes[a.node].TieRank, c.Nodes[b.node].TieRank
	if ra != rb {
		return ra < rb
	}
	if a.tie != b.tie {
		return a.tie < b.tie
	}
	return a.node < b.node
}

// chooseGPUs picks the GPUs of node n for the request, or false. For a
// multi-GPU request it returns the first usable whole GPUs (inside one
// NVLink domain when asked): every whole GPU leaves the same state, so
// ranking does not depend on which; finalGPUs picks the set for the winner.
func (p *Placer) chooseGPUs(n *Node, r *Request, s *shape, seed uint64) ([]Share, int64, bool) {
	if s.count == 0 {
		return nil, -1, true // CPU-only
	}
	if s.count == 1 {
		return p.chooseOne(n, s, seed)
	}
	if r.NVLink {
		var perDomain [MaxNVLinkDomains]int
		ok := false
		for i := range n.GPUs {
			d := n.GPUs[i].NVLinkDomain
			if d < 0 || d >= MaxNVLinkDomains {
				continue
			}
			if _, u := usable(&n.GPUs[i], s); u {
				perDomain[d]++
				ok = ok || perDomain[d] >= s.count
			}
		}
		if !ok {
			return nil, 0, false
		}
	}
	shares := make([]Share, 0, s.count)
	for i := range n.GPUs {
		if sh, ok := usable(&n.GPUs[i], s); ok {
			shares = append(shares, sh)
			if len(shares) == s.count {
				return shares, -1, true
			}
		}
	}
	return nil, 0, false
}

// MaxNVLinkDomains bounds the NVLink domains of one node the placer reads.
const MaxNVLinkDomains = 64

// MaxGPUsPerNode is the most GPUs of one node the placer expects.
const MaxGPUsPerNode = 256

// finalGPUs picks the GPU set of a multi-GPU request on the winning node:
// the tightest NVLink domain that fits, or the fewest PCIe hops.
func (p *Placer) finalGPUs(n *Node, r *Request, s *shape, scored []Share) []Share {
	if s.count <= 1 {
		return scored
	}
	var free []Share
	for i := range n.GPUs {
		if sh, ok := usable(&n.GPUs[i], s); ok {
			free = append(free, sh)
		}
	}
	if r.NVLink {
		if set, ok := nvlinkSet(n, free, s.count); ok {
			return set
		}
		return scored
	}
	return fewestHops(n, free, s.count)
}

// chooseOne picks one GPU by the policy's GPU rule: FGD the GPU whose use
// grows fragmentation least, random a random one, first-fit the first,
// the others the tightest (least free milli that fits).
// The score is FGD's for the chosen GPU when FGD chose it, else -1.
func (p *Placer) chooseOne(n *Node, s *shape, seed uint64) ([]Share, int64, bool) {
	best, count := -1, 0
	var bestShare Share
	var bestFGD int64 = -1
	var one [1]Share
	prepared := false
	var rng *rand.Rand
	if p.opts.Policy == PolicyRandom {
		rng = rand.New(rand.NewPCG(seed, hashString(n.ID)))
	}
	var w *Workload
	fragAware := (p.opts.Policy == PolicyFGD || p.opts.Policy == PolicyShizu) && !s.whole
	if fragAware {
		w = p.workload(s)
	}
	var tried [16]int64
	nTried := 0
	for i := range n.GPUs {
		g := &n.GPUs[i]
		sh, ok := usable(g, s)
		if !ok {
			continue
		}
		count++
		switch {
		case p.opts.Policy == PolicyFirstFit:
			if best < 0 {
				best, bestShare = i, sh
			}
		case p.opts.Policy == PolicyRandom:
			// Reservoir sampling: each usable GPU with equal chance.
			if rng.IntN(count) == 0 {
				best, bestShare = i, sh
			}
		case fragAware:
			// GPUs with the same free milli leave the same state: score
			// the first of each.
			if slices.Contains(tried[:nTried], g.FreeMilli) {
				continue
			}
			if nTried < len(tried) {
				tried[nTried] = g.FreeMilli
				nTried++
			}
			one[0] = sh
			if !prepared {
				w.prepare(n, &p.fgd)
				prepared = true
			}
			sc := p.fragScore(w, n, s.cpu, one[:])
			if sc > bestFGD {
				best, bestShare, bestFGD = i, sh, sc
			}
		case s.whole:
			if best < 0 {
				best, bestShare = i, sh
			}
		default:
			if best < 0 || g.FreeMilli < n.GPUs[best].FreeMilli {
				best, bestShare = i, sh
			}
		}
	}
	if best < 0 {
		return nil, 0, false
	}
	return []Share{bestShare}, bestFGD, true
}

// nvlinkSet takes the count GPUs inside the tightest NVLink domain (fewest
// usable GPUs) that has enough, keeping larger domains whole.
func nvlinkSet(n *Node, free []Share, count int) ([]Share, bool) {
	byDomain := map[int][]Share{}
	for _, sh := range free {
		if d := n.GPUs[sh.Index].NVLinkDomain; d >= 0 {
			byDomain[d] = append(byDomain[d], sh)
		}
	}
	bestDomain := -1
	for d, shs := range byDomain {
		if len(shs) < count {
			continue
		}
		if bestDomain < 0 || len(shs) < len(byDomain[bestDomain]) || (len(shs) == len(byDomain[bestDomain]) && d < bestDomain) {
			bestDomain = d
		}
	}
	if bestDomain < 0 {
		return nil, false
	}
	return fewestHops(n, byDomain[bestDomain], count), true
}

// Hops is the PCIe distance between two GPUs of a node: 0 to itself, 1 on
// one PCIe switch, 2 on one NUMA node, 3 across the host.
func Hops(a, b *GPU) int {
	switch {
	case a.Index == b.Index:
		return 0
	case a.PCIeSwitch == b.PCIeSwitch:
		return 1
	case a.NUMA == b.NUMA:
		return 2
	}
	return 3
}

// fewestHops picks count GPUs of free with the least total pairwise PCIe
// distance: from each start GPU, greedily add the nearest; keep the best
// set (ties: lowest indexes).
func fewestHops(n *Node, free []Share, count int) []Share {
	if len(free) == count {
		return slices.Clone(free)
	}
	var best []Share
	bestCost := -1
	for start := range free {
		set := []Share{free[start]}
		used := make([]bool, len(free))
		used[start] = true
		cost := 0
		for len(set) < count {
			pick, pickCost := -1, 0
			for j := range free {
				if used[j] {
					continue
				}
				c := 0
				for _, sh := range set {
					c += Hops(&n.GPUs[sh.Index], &n.GPUs[free[j].Index])
				}
				if pick < 0 || c < pickCost {
					pick, pickCost = j, c
				}
			}
			used[pick] = true
			set = append(set, free[pick])
			cost += pickCost
		}
		if bestCost < 0 || cost < bestCost {
			best, bestCost = set, cost
		}
	}
	slices.SortFunc(best, func(a, b Share) int { return cmp.Compare(a.Index, b.Index) })
	return best
}

func (p *Placer) workload(s *shape) *Workload {
	if p.opts.Workload != nil && len(p.opts.Workload.Classes) > 0 {
		return p.opts.Workload
	}
	// No history yet: measure against the request itself.
	return &Workload{Classes: []TaskClass{{TaskShape: TaskShape{CPUMilli: s.cpu, GPUs: s.count, Milli: s.milli}, Weight: 1}}}
}

// rank scores every candidate under the policy.
func (p *Placer) rank(c *Cluster, r *Request, s *shape, seed uint64) {
	reqHash := hashString(r.ID)
	switch p.opts.Policy {
	case PolicyFGD, PolicyShizu:
		w := p.workload(s)
		for i := range p.cands {
			cd := &p.cands[i]
			if cd.score < 0 { // not scored while choosing the GPU
				n := &c.Nodes[cd.node]
				w.prepare(n, &p.fgd)
				cd.score = p.fragScore(w, n, s.cpu, cd.shares)
			}
		}
	case PolicyBestFit, PolicyFixed:
		lo, hi := int64(1<<62), int64(-1<<62)
		for i := range p.cands {
			cd := &p.cands[i]
			cd.score = ScoreBestFit(&c.Nodes[cd.node], s.cpu, int64(s.count)*s.milli, p.opts.NormCPUMilli, p.opts.NormGPUMilli)
			lo, hi = min(lo, cd.score), max(hi, cd.score)
		}
		for i := range p.cands {
			if hi > lo {
				p.cands[i].score = (p.cands[i].score - lo) * 100 / (hi - lo)
			} else {
				p.cands[i].score = 0
			}
		}
	case PolicyDotProduct:
		for i := range p.cands {
			cd := &p.cands[i]
			cd.score = ScoreDotProduct(&c.Nodes[cd.node], s.cpu, int64(s.count)*s.milli, p.opts.NormCPUMilli, p.opts.NormGPUMilli)
		}
	case PolicyGPUPacking, PolicyGPUClustering:
		p.rankBaseline(c, s)
	case PolicyFirstFit:
		for i := range p.cands {
			p.cands[i].score = -int64(p.cands[i].node)
		}
	case PolicyRandom:
		for i := range p.cands {
			p.cands[i].score = int64(mix(seed, hashString(c.Nodes[p.cands[i].node].ID)) >> 1)
		}
	}
	for i := range p.cands {
		p.cands[i].tie = mix(reqHash, hashString(c.Nodes[p.cands[i].node].ID))
	}
}

// ScoreBestFit is the simulator's best-fit score before normalisation:
// int64(100·(1 − s)), s = ½·(c_n − cpu)/normCPU + ½·(R_n − gpu)/normGPU.
func ScoreBestFit(n *Node, cpu, gpuMilli, normCPU, normGPU int64) int64 {
	s := 0.5*float64(n.FreeCPUMilli-cpu)/float64(normCPU) + 0.5*float64(n.freeMilli()-gpuMilli)/float64(normGPU)
	return int64(100 * (1 - s))
}

// ScoreDotProduct is the simulator's dot-product score:
// int64(100·(1 − (node·task)/2)) with node = (c_n/normCPU, R_n/normGPU) and
// task = (cpu/normCPU, gpu/normGPU).
func ScoreDotProduct(n *Node, cpu, gpuMilli, normCPU, normGPU int64) int64 {
	nc, ng := float64(n.FreeCPUMilli)/float64(normCPU), float64(n.freeMilli())/float64(normGPU)
	tc, tg := float64(cpu)/float64(normCPU), float64(gpuMilli)/float64(normGPU)
	return int64(100 * (1 - (nc*tc+ng*tg)/2))
}

func hashString(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	return h.Sum64()
}

// mix combines two hashes (splitmix64 finaliser).
func mix(a, b uint64) uint64 {
	z := a ^ (b + 0x9e3779b97f4a7c15 + (a << 6) + (a >> 2))
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
