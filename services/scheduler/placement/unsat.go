package placement

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/shizu-gpu/shizu/shared/rent"
)

// Offer is a kind of node the autoscaler may provision for a shortage (an
// instance type of its policy file's fleet section): GPUs of one model, in
// some zones, bought on either market. It says nothing of the host's CPU,
// memory, NVLink domains or MIG instances, so an offer is taken to have
// whatever of those its model can have (the catalogue's "nvlink", "cc" and
// "mig" capabilities), all its GPUs in one NVLink domain, and host room
// for any request: an offer never rules a request out on those.
type Offer struct {
	// Name is the provider's instance type, e.g. "p5.48xlarge".
	Name  string
	Model string
	GPUs  int
	// Zones it can be started in.
	Zones []string
}

// Fleet is what a request is judged against to know whether it could ever
// be placed: every registered node (on its whole shape, whatever is free
// now, whatever its status) and every offer.
type Fleet struct {
	Nodes  []Node
	Offers []Offer
}

// Empty reports whether the fleet has neither a node nor an offer: nothing
// to judge a request against.
func (f *Fleet) Empty() bool { return len(f.Nodes) == 0 && len(f.Offers) == 0 }

// host is one thing that could hold a request: a node, or a node of an
// offer, by its whole shape.
type host struct {
	node  *Node // nil for an offer
	offer *Offer
}

func (h host) model() string {
	if h.node != nil {
		return h.node.model()
	}
	return h.offer.Model
}

// Unsatisfiable says which constraint of r rules out every node of f and
// every offer, judged on their whole shape: a request it names can never
// be placed, however much capacity frees up. "" when some node or offer
// could hold r, and when f is empty (nothing to judge against). The
// constraints are tried in the order zone, market, model, TEE,
// capabilities, GPU count, NVLink, MIG profile, GPU memory, host CPU, host
// memory; the first that leaves nothing is named, in words for people,
// e.g. "needs 9 GPUs on one node; the largest node has 8".
func Unsatisfiable(r *Request, f *Fleet, c Catalogue) string {
	if f.Empty() {
		return ""
	}
	hosts := make([]host, 0, len(f.Nodes)+len(f.Offers))
	for i := range f.Nodes {
		hosts = append(hosts, host{node: &f.Nodes[i]})
	}
	for i := range f.Offers {
		hosts = append(hosts, host{offer: &f.Offers[i]})
	}
	for _, con := range constraints(r) {
		if !con.applies {
			continue
		}
		kept := hosts[:0:0]
		for _, h := range hosts {
			if con.ok(c, h) {
				kept = append(kept, h)
			}
		}
		if len(kept) == 0 {
			return con.why(c, hosts)
		}
		hosts = kept
	}
	return ""
}

// constraint is one requirement of a request: whether the request has it,
// whether a host meets it, and why none of the hosts left does.
type constraint struct {
	applies bool
	ok      func(c Catalogue, h host) bool
	why     func(c Catalogue, left []host) string
}

func constraints(r *Request) []constraint {
	return []constraint{
		{r.Zone != "", func(_ Catalogue, h host) bool { return h.inZone(r.Zone) },
			func(_ Catalogue, left []host) string {
				return fmt.Sprintf("zone %q: no node%s is in that zone (zones: %s)",
					r.Zone, orOffer(left), list(left, func(h host) []string { return h.zones() }))
			}},
		{r.Market != rent.AnyMarket, func(_ Catalogue, h host) bool { return h.node == nil || h.node.Market == r.Market },
			func(_ Catalogue, _ []host) string {
				return fmt.Sprintf("market %s: no node%s is bought %s, and the autoscaler may provision none", r.Market, where(r), r.Market)
			}},
		{len(r.Models) > 0, func(_ Catalogue, h host) bool { return slices.Contains(r.Models, h.model()) },
			func(_ Catalogue, left []host) string {
				return fmt.Sprintf("GPU model %s: no node%s%s has it (models: %s)",
					strings.Join(r.Models, " or "), where(r), orOffer(left), list(left, func(h host) []string { return []string{h.model()} }))
			}},
		{r.TEE, func(c Catalogue, h host) bool {
			if h.node != nil {
				return h.node.TEE
			}
			return c.Has(h.offer.Model, "cc")
		}, func(_ Catalogue, left []host) string {
			return fmt.Sprintf("TEE: %s has confidential computing", noneOf(left, r))
		}},
		{len(r.Capabilities) > 0, func(c Catalogue, h host) bool {
			for _, capability := range r.Capabilities {
				if !c.Has(h.model(), capability) {
					return false
				}
			}
			return true
		}, func(_ Catalogue, left []host) string {
			return fmt.Sprintf("capabilities %s: %s has them all", strings.Join(r.Capabilities, ", "), noneOf(left, r))
		}},
		{r.GPUCount > 0, func(_ Catalogue, h host) bool { return h.gpus() >= r.GPUCount },
			func(_ Catalogue, left []host) string {
				most := 0
				for _, h := range left {
					most = max(most, h.gpus())
				}
				return fmt.Sprintf("needs %d GPUs on one node; the largest node%s%s has %d",
					r.GPUCount, scope(r), orOffer(left), most)
			}},
		{r.NVLink, func(c Catalogue, h host) bool { return h.nvlinkGPUs(c) >= r.GPUCount },
			func(c Catalogue, left []host) string {
				most := 0
				for _, h := range left {
					most = max(most, h.nvlinkGPUs(c))
				}
				return fmt.Sprintf("NVLink: %s has %d GPUs linked by NVLink (at most %d)", noneOf(left, r), r.GPUCount, most)
			}},
		{r.MIGProfile != "", func(c Catalogue, h host) bool { return h.hasMIG(c, r.MIGProfile) },
			func(_ Catalogue, _ []host) string {
				return fmt.Sprintf("MIG profile %s: no node%s has a GPU with a MIG instance of that profile, and no instance type the autoscaler may provision can have one",
					r.MIGProfile, scope(r))
			}},
		{r.VRAMMiB > 0 && r.MIGProfile == "", func(c Catalogue, h host) bool { return h.maxVRAM(c) >= r.VRAMMiB },
			func(c Catalogue, left []host) string {
				var most int64
				for _, h := range left {
					most = max(most, h.maxVRAM(c))
				}
				return fmt.Sprintf("GPU memory: needs %d MiB per GPU; the most any node%s%s has is %d MiB",
					r.VRAMMiB, scope(r), orOffer(left), most)
			}},
		{r.CPUMilli > 0, func(_ Catalogue, h host) bool { return h.node == nil || h.node.CPUMilli >= r.CPUMilli },
			func(_ Catalogue, left []host) string {
				var most int64
				for _, h := range left {
					most = max(most, h.node.CPUMilli)
				}
				return fmt.Sprintf("host CPU: needs %s cores on one node; the largest node%s has %s", cores(r.CPUMilli), scope(r), cores(most))
			}},
		{r.MemoryMiB > 0, func(_ Catalogue, h host) bool { return h.node == nil || h.node.MemoryMiB >= r.MemoryMiB },
			func(_ Catalogue, left []host) string {
				var most int64
				for _, h := range left {
					most = max(most, h.node.MemoryMiB)
				}
				return fmt.Sprintf("host memory: needs %d MiB on one node; the largest node%s has %d MiB", r.MemoryMiB, scope(r), most)
			}},
	}
}

func (h host) inZone(zone string) bool { return slices.Contains(h.zones(), zone) }

func (h host) zones() []string {
	if h.node != nil {
		return []string{h.node.Zone}
	}
	return h.offer.Zones
}

func (h host) gpus() int {
	if h.node != nil {
		return len(h.node.GPUs)
	}
	return h.offer.GPUs
}

// nvlinkGPUs is the size of the host's largest NVLink domain.
func (h host) nvlinkGPUs(c Catalogue) int {
	if h.node == nil {
		if c.Has(h.offer.Model, "nvlink") {
			return h.offer.GPUs
		}
		return 0
	}
	size := map[int]int{}
	most := 0
	for i := range h.node.GPUs {
		if d := h.node.GPUs[i].NVLinkDomain; d >= 0 {
			size[d]++
			most = max(most, size[d])
		}
	}
	return most
}

// hasMIG: a node has a GPU with a MIG instance of the profile (the node
// agent runs a MIG rental on an instance that exists, it creates none); an
// offer's model can be split and has room for the profile.
func (h host) hasMIG(c Catalogue, profile string) bool {
	if h.node == nil {
		prof, ok := ParseMIGProfile(profile)
		return ok && c.Has(h.offer.Model, "mig") && c[h.offer.Model].VRAMMiB >= prof.VRAMMiB
	}
	for i := range h.node.GPUs {
		for _, m := range h.node.GPUs[i].MIGInstances {
			if m.Profile == profile {
				return true
			}
		}
	}
	return false
}

func (h host) maxVRAM(c Catalogue) int64 {
	if h.node == nil {
		return c[h.offer.Model].VRAMMiB
	}
	var most int64
	for i := range h.node.GPUs {
		most = max(most, h.node.GPUs[i].VRAMMiB)
	}
	return most
}

// noneOf is "no node ... or instance type" narrowed by the request's zone
// and models, e.g. "no RTX4090-24GB node or instance type".
func noneOf(left []host, r *Request) string {
	models := list(left, func(h host) []string { return []string{h.model()} })
	s := fmt.Sprintf("no %s node", models)
	if r.Zone != "" {
		s += fmt.Sprintf(" in zone %q", r.Zone)
	}
	return s + orOffer(left)
}

// orOffer is " or instance type the autoscaler may provision" when hs
// has an offer.
func orOffer(hs []host) string {
	if offers(hs) {
		return " or instance type the autoscaler may provision"
	}
	return ""
}

// scope narrows "the largest node" to the request's models and zone:
// "" or " of X in zone \"z\"".
func scope(r *Request) string {
	s := ""
	if len(r.Models) > 0 {
		s += " of " + strings.Join(r.Models, " or ")
	}
	return s + where(r)
}

// where is " in zone \"z\"" for a request that names a zone, else "".
func where(r *Request) string {
	if r.Zone == "" {
		return ""
	}
	return fmt.Sprintf(" in zone %q", r.Zone)
}

func offers(hs []host) bool {
	return slices.ContainsFunc(hs, func(h host) bool { return h.offer != nil })
}

// list names the distinct values of the hosts, sorted and joined.
func list(hs []host, of func(host) []string) string {
	seen := map[string]bool{}
	var out []string
	for _, h := range hs {
		for _, v := range of(h) {
			if v != "" && !seen[v] {
				seen[v] = true
				out = append(out, v)
			}
		}
	}
	sort.Strings(out)
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

func cores(milli int64) string {
	if milli%1000 == 0 {
		return fmt.Sprintf("%d", milli/1000)
	}
	return fmt.Sprintf("%.3g", float64(milli)/1000)
}
