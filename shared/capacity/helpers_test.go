package capacity_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

// newStore starts its own redis-server and returns a store on it.
func newStore(t testing.TB, opts ...capacity.Option) (*capacity.Store, *redis.Client) {
	t.Helper()
	rdb := testkit.StartRedis(t).Client(t)
	return storeOn(t, rdb, opts...), rdb
}

// storeOn returns a store on a shared server; give each test its own
// prefix (prefixFor) so they do not see each other.
func storeOn(t testing.TB, rdb *redis.Client, opts ...capacity.Option) *capacity.Store {
	t.Helper()
	s, err := capacity.New(rdb, opts...)
	if err != nil {
		t.Fatalf("new store: %v", err)
	}
	return s
}

// prefixFor turns a test name into a key prefix of its own.
func prefixFor(t testing.TB) capacity.Option {
	return capacity.WithPrefix("t:" + strings.NewReplacer(" ", "_", "/", ":").Replace(t.Name()))
}

// gpuNode is a valid node with n 80 GiB MIG-capable GPUs, all in one NVLink domain.
func gpuNode(id string, n int) capacity.Node {
	node := capacity.Node{
		ID: id, Zone: "zone-a", Market: capacity.MarketOnDemand,
		PricePerGPUHourMicros: 2_500_000, Currency: "USD",
		CPUMilli: 64_000, MemoryMiB: 512 * 1024,
		Labels: map[string]string{"pool": "h100"},
	}
	var domain []int
	for i := range n {
		node.GPUs = append(node.GPUs, capacity.GPU{
			Index: i, UUID: fmt.Sprintf("GPU-%s-%d", id, i), Model: "H100-SXM-80GB",
			VRAMMiB: 80 * 1024, MIGCapable: true,
		})
		domain = append(domain, i)
	}
	for i := range node.GPUs {
		for j := range n {
			if j != i {
				node.GPUs[i].NVLinkPeers = append(node.GPUs[i].NVLinkPeers, j)
			}
		}
	}
	if n > 1 {
		node.NVLinkDomains = [][]int{domain}
	}
	return node
}

// migNode is gpuNode(id, 2) with GPU 1 in MIG mode, partitioned into a
// 1g.10gb instance MIG-<id>-1a and a 3g.40gb instance MIG-<id>-1b.
func migNode(id string) capacity.Node {
	n := gpuNode(id, 2)
	n.GPUs[1].MIGEnabled = true
	n.GPUs[1].MIGInstances = []capacity.MIGInstance{
		{UUID: "MIG-" + id + "-1a", Profile: "1g.10gb", VRAMMiB: 9856},
		{UUID: "MIG-" + id + "-1b", Profile: "3g.40gb", VRAMMiB: 40192},
	}
	return n
}

// migShare is a 1g.10gb share of MIG instance uuid on GPU index.
func migShare(index int, uuid string) capacity.GPUShare {
	return capacity.GPUShare{Index: index, Milli: 142, VRAMMiB: 10240, MIGProfile: "1g.10gb", MIGInstance: uuid}
}

// place is a valid placement for tenant "acme" with 4 cores and 32 GiB.
func place(rental, node string, epoch uint64, shares ...capacity.GPUShare) capacity.Placement {
	return capacity.Placement{
		RentalID: rental, NodeID: node, Epoch: epoch, Tenant: "acme",
		CPUMilli: 4000, MemoryMiB: 32 * 1024, GPUs: shares,
	}
}

func share(index int, milli, vramMiB int64) capacity.GPUShare {
	return capacity.GPUShare{Index: index, Milli: milli, VRAMMiB: vramMiB}
}

// conserved checks one node's books: nothing free is negative, free plus
// allocated equals the total for the host and for every GPU, and every
// GPU's sharer count is the number of allocations on it, within its limit.
func conserved(st capacity.NodeState) error {
	var errs []error
	cpu, mem := st.FreeCPUMilli, st.FreeMemoryMiB
	if cpu < 0 || mem < 0 {
		errs = append(errs, fmt.Errorf("node %s: host free cpu %d mem %d", st.ID, cpu, mem))
	}
	if len(st.FreeGPUs) != len(st.GPUs) {
		return fmt.Errorf("node %s: %d GPU states for %d GPUs", st.ID, len(st.FreeGPUs), len(st.GPUs))
	}
	milli := make([]int64, len(st.GPUs))
	vram := make([]int64, len(st.GPUs))
	sharers := make([]int, len(st.GPUs))
	for i, g := range st.FreeGPUs {
		if g.Milli < 0 || g.VRAMMiB < 0 {
			errs = append(errs, fmt.Errorf("node %s GPU %d: over-committed: free milli %d vram %d", st.ID, i, g.Milli, g.VRAMMiB))
		}
		if g.Sharers > g.MaxSharers {
			errs = append(errs, fmt.Errorf("node %s GPU %d: %d sharers, limit %d", st.ID, i, g.Sharers, g.MaxSharers))
		}
		milli[i], vram[i] = g.Milli, g.VRAMMiB
	}
	for _, a := range st.Allocations {
		cpu += a.CPUMilli
		mem += a.MemoryMiB
		for _, g := range a.GPUs {
			if g.Index >= len(st.GPUs) {
				errs = append(errs, fmt.Errorf("node %s: rental %s uses missing GPU %d", st.ID, a.RentalID, g.Index))
				continue
			}
			milli[g.Index] += g.Milli
			vram[g.Index] += g.VRAMMiB
			sharers[g.Index]++
		}
	}
	if cpu != st.CPUMilli || mem != st.MemoryMiB {
		errs = append(errs, fmt.Errorf("node %s: host free+allocated cpu %d/%d mem %d/%d", st.ID, cpu, st.CPUMilli, mem, st.MemoryMiB))
	}
	for i, g := range st.GPUs {
		if milli[i] != capacity.MilliPerGPU || vram[i] != g.VRAMMiB || sharers[i] != st.FreeGPUs[i].Sharers {
			errs = append(errs, fmt.Errorf("node %s GPU %d: free+allocated milli %d/%d vram %d/%d, sharers %d but %d allocations",
				st.ID, i, milli[i], capacity.MilliPerGPU, vram[i], g.VRAMMiB, st.FreeGPUs[i].Sharers, sharers[i]))
		}
		if st.FreeGPUs[i].MaxSharers != g.EffectiveMaxSharers() {
			errs = append(errs, fmt.Errorf("node %s GPU %d: max sharers %d, spec says %d", st.ID, i, st.FreeGPUs[i].MaxSharers, g.EffectiveMaxSharers()))
		}
	}
	return errors.Join(errs...)
}

// mustNode reads a node and checks its books.
func mustNode(t testing.TB, s *capacity.Store, id string) capacity.NodeState {
	t.Helper()
	st, err := s.Node(t.Context(), id)
	if err != nil {
		t.Fatalf("read node %s: %v", id, err)
	}
	if err := conserved(st); err != nil {
		t.Fatalf("books of node %s: %v", id, err)
	}
	return st
}

func mustRegister(t testing.TB, s *capacity.Store, n capacity.Node) uint64 {
	t.Helper()
	epoch, err := s.Register(t.Context(), n)
	if err != nil {
		t.Fatalf("register %s: %v", n.ID, err)
	}
	return epoch
}

func mustReserve(t testing.TB, s *capacity.Store, p capacity.Placement) capacity.Allocation {
	t.Helper()
	a, err := s.Reserve(t.Context(), p)
	if err != nil {
		t.Fatalf("reserve %s: %v", p.RentalID, err)
	}
	return a
}

func mustVersion(t testing.TB, s *capacity.Store) uint64 {
	t.Helper()
	v, err := s.Version(t.Context())
	if err != nil {
		t.Fatalf("version: %v", err)
	}
	return v
}
