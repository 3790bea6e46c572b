package capacity

import (
	"fmt"
	"strings"
	"unicode"
)

// Limits enforced by Validate. They keep every quantity an exact integer in
// Redis's Lua (doubles) and every id safe inside a key's {hash tag}.
const (
	MaxIDLen       = 128
	MaxQuantity    = 1 << 40 // MiB, milli-cores: far above any real host
	MaxGPUsPerNode = 256
)

// problems collects validation failures, each prefixed by its field path.
type problems []error

func (p *problems) addf(field, format string, args ...any) {
	*p = append(*p, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
}

// id checks an identifier used inside Redis keys: 1..MaxIDLen characters
// from [A-Za-z0-9._:-].
func (p *problems) id(field, v string) {
	if v == "" {
		p.addf(field, "must not be empty")
		return
	}
	if len(v) > MaxIDLen {
		p.addf(field, "longer than %d characters", MaxIDLen)
		return
	}
	for _, r := range v {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == ':' || r == '-') {
			p.addf(field, "%q: only letters, digits and . _ : - are allowed", v)
			return
		}
	}
}

// text checks a free-form name: non-empty, bounded, no spaces or control characters.
func (p *problems) text(field, v string) {
	if v == "" {
		p.addf(field, "must not be empty")
		return
	}
	if len(v) > MaxIDLen {
		p.addf(field, "longer than %d characters", MaxIDLen)
		return
	}
	for _, r := range v {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			p.addf(field, "%q contains a space or control character", v)
			return
		}
	}
}

func (p *problems) quantity(field string, v, min int64) {
	if v < min || v > MaxQuantity {
		p.addf(field, "must be in %d..%d, got %d", min, int64(MaxQuantity), v)
	}
}

// Validate reports every problem with n, joined, as an error satisfying
// IsInvalid; nil when n can be registered.
func (n Node) Validate() error {
	var p problems
	p.id("ID", n.ID)
	p.id("Zone", n.Zone)
	if n.Market != MarketOnDemand && n.Market != MarketSpot {
		p.addf("Market", "must be %q or %q, got %q", MarketOnDemand, MarketSpot, n.Market)
	}
	if n.PricePerGPUHourMicros < 0 {
		p.addf("PricePerGPUHourMicros", "must not be negative, got %d", n.PricePerGPUHourMicros)
	}
	if !isCurrency(n.Currency) {
		p.addf("Currency", "must be a three-letter ISO 4217 code such as USD, got %q", n.Currency)
	}
	p.quantity("CPUMilli", n.CPUMilli, 1)
	p.quantity("MemoryMiB", n.MemoryMiB, 1)
	if len(n.GPUs) == 0 || len(n.GPUs) > MaxGPUsPerNode {
		p.addf("GPUs", "must list 1..%d GPUs, got %d", MaxGPUsPerNode, len(n.GPUs))
	}
	uuids := make(map[string]int, len(n.GPUs))
	for i, g := range n.GPUs {
		f := fmt.Sprintf("GPUs[%d]", i)
		if g.Index != i {
			p.addf(f+".Index", "must equal its position %d, got %d", i, g.Index)
		}
		if g.UUID == "" {
			p.addf(f+".UUID", "must not be empty")
		} else if j, dup := uuids[g.UUID]; dup {
			p.addf(f+".UUID", "%q is also GPU %d's", g.UUID, j)
		} else {
			uuids[g.UUID] = i
		}
		p.text(f+".Model", g.Model)
		p.quantity(f+".VRAMMiB", g.VRAMMiB, 1)
		if g.MaxSharers < 0 || g.MaxSharers > MilliPerGPU {
			p.addf(f+".MaxSharers", "must be in 0..%d (0 = %d), got %d", MilliPerGPU, DefaultMaxSharers, g.MaxSharers)
		}
		if g.MIGEnabled && !g.MIGCapable {
			p.addf(f+".MIGEnabled", "MIG mode on a GPU that is not MIG-capable")
		}
		if len(g.MIGInstances) > 0 && !g.MIGEnabled {
			p.addf(f+".MIGInstances", "%d instances on a GPU not in MIG mode", len(g.MIGInstances))
		}
		if len(g.MIGInstances) > MaxMIGInstances {
			p.addf(f+".MIGInstances", "%d instances; a GPU has at most %d", len(g.MIGInstances), MaxMIGInstances)
		}
		for k, m := range g.MIGInstances {
			mf := fmt.Sprintf("%s.MIGInstances[%d]", f, k)
			if m.UUID == "" || strings.ContainsAny(m.UUID, " \t\n") {
				p.addf(mf+".UUID", "must be a non-empty UUID without spaces, got %q", m.UUID)
			} else if j, dup := uuids[m.UUID]; dup {
				p.addf(mf+".UUID", "%q is also GPU %d's or one of its instances'", m.UUID, j)
			} else {
				uuids[m.UUID] = i
			}
			p.text(mf+".Profile", m.Profile)
			p.quantity(mf+".VRAMMiB", m.VRAMMiB, 0)
		}
		seen := map[int]bool{}
		for k, peer := range g.NVLinkPeers {
			pf := fmt.Sprintf("%s.NVLinkPeers[%d]", f, k)
			switch {
			case peer < 0 || peer >= len(n.GPUs):
				p.addf(pf, "GPU %d does not exist", peer)
			case peer == i:
				p.addf(pf, "a GPU is not its own peer")
			case seen[peer]:
				p.addf(pf, "GPU %d listed twice", peer)
			}
			seen[peer] = true
		}
	}
	domainOf := map[int]int{}
	for d, dom := range n.NVLinkDomains {
		f := fmt.Sprintf("NVLinkDomains[%d]", d)
		if len(dom) == 0 {
			p.addf(f, "must not be empty")
		}
		for _, gi := range dom {
			if gi < 0 || gi >= len(n.GPUs) {
				p.addf(f, "GPU %d does not exist", gi)
				continue
			}
			if other, dup := domainOf[gi]; dup {
				p.addf(f, "GPU %d is already in NVLinkDomains[%d]", gi, other)
				continue
			}
			domainOf[gi] = d
		}
	}
	for k := range n.Labels {
		if k == "" {
			p.addf("Labels", "keys must not be empty")
		}
	}
	return invalid(p...)
}

func isCurrency(c string) bool {
	if len(c) != 3 {
		return false
	}
	for _, r := range c {
		if r < 'A' || r > 'Z' {
			return false
		}
	}
	return true
}

// Validate reports every problem with p, joined, as an error satisfying
// IsInvalid; nil when p can be sent to Reserve. It cannot know the node:
// a GPU index the node lacks is reported by Reserve.
func (pl Placement) Validate() error {
	var p problems
	p.id("RentalID", pl.RentalID)
	p.id("NodeID", pl.NodeID)
	if pl.Epoch == 0 {
		p.addf("Epoch", "must be the node epoch the scheduler saw (>= 1), got 0")
	}
	p.text("Tenant", pl.Tenant)
	p.quantity("CPUMilli", pl.CPUMilli, 0)
	p.quantity("MemoryMiB", pl.MemoryMiB, 0)
	if pl.Attempt < 0 {
		p.addf("Attempt", "must not be negative, got %d", pl.Attempt)
	}
	if pl.Quota != nil {
		pl.Quota.check(&p, "Quota")
	}
	if len(pl.GPUs) == 0 || len(pl.GPUs) > MaxGPUsPerNode {
		p.addf("GPUs", "must list 1..%d GPU shares, got %d", MaxGPUsPerNode, len(pl.GPUs))
	}
	seen := map[int]int{}
	for i, g := range pl.GPUs {
		f := fmt.Sprintf("GPUs[%d]", i)
		if g.Index < 0 || g.Index >= MaxGPUsPerNode {
			p.addf(f+".Index", "must be in 0..%d, got %d", MaxGPUsPerNode-1, g.Index)
		} else if j, dup := seen[g.Index]; dup {
			p.addf(f+".Index", "GPU %d is also GPUs[%d]", g.Index, j)
		} else {
			seen[g.Index] = i
		}
		if g.Milli < 1 || g.Milli > MilliPerGPU {
			p.addf(f+".Milli", "must be in 1..%d, got %d", MilliPerGPU, g.Milli)
		}
		p.quantity(f+".VRAMMiB", g.VRAMMiB, 0)
		if g.MIGProfile != "" {
			p.text(f+".MIGProfile", g.MIGProfile)
		}
		if (g.MIGProfile == "") != (g.MIGInstance == "") {
			p.addf(f+".MIGInstance", "a MIG share names both its profile and its instance, got profile %q instance %q", g.MIGProfile, g.MIGInstance)
		} else if g.MIGInstance != "" && strings.ContainsAny(g.MIGInstance, " \t\n") {
			p.addf(f+".MIGInstance", "must not contain spaces, got %q", g.MIGInstance)
		}
	}
	return invalid(p...)
}

// CheckID reports whether v is an identifier the store accepts (a node or
// rental id: 1..MaxIDLen characters from [A-Za-z0-9._:-]), as an error
// satisfying IsInvalid that names field. Every store implementation checks
// its ids with it.
func CheckID(field, v string) error {
	var p problems
	p.id(field, v)
	return invalid(p...)
}
