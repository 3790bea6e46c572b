package placement_test

import (
	"fmt"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// node is a ready on-demand node in zone-a with n empty H100s, all in one
// NVLink domain, two GPUs per PCIe switch and half of them per NUMA node.
func node(id string, n int) placement.Node {
	nd := placement.Node{
		ID: id, Epoch: 1, Ready: true, Zone: "zone-a", Market: rent.OnDemand,
		CPUMilli: 128_000, MemoryMiB: 1 << 20, FreeCPUMilli: 128_000, FreeMemoryMiB: 1 << 20,
	}
	for i := range n {
		nd.GPUs = append(nd.GPUs, placement.GPU{
			Index: i, UUID: fmt.Sprintf("GPU-%s-%d", id, i), Model: "H100-SXM5-80GB", VRAMMiB: 80 * 1024,
			FreeMilli: 1000, FreeVRAMMiB: 80 * 1024, MIGCapable: true, NVLinkDomain: 0,
			PCIeSwitch: i / 2, NUMA: i * 2 / max(n, 1),
		})
	}
	return nd
}

func with(n placement.Node, edit func(*placement.Node)) placement.Node {
	edit(&n)
	return n
}

// use takes milli and VRAM from GPU i as if a rental held them.
func use(n *placement.Node, i int, milli, vram int64) {
	n.GPUs[i].FreeMilli -= milli
	n.GPUs[i].FreeVRAMMiB -= vram
	n.GPUs[i].Sharers++
}

// req is a valid on-demand request for one whole GPU.
func req(id string, edit ...func(*placement.Request)) placement.Request {
	r := placement.Request{ID: id, Tenant: "acme", Class: rent.ClassOnDemand, GPUCount: 1, MilliPerGPU: 1000,
		CPUMilli: 4000, MemoryMiB: 16 * 1024}
	for _, e := range edit {
		e(&r)
	}
	return r
}

func fraction(milli, vram int64) func(*placement.Request) {
	return func(r *placement.Request) { r.MilliPerGPU, r.VRAMMiB = milli, vram }
}

func gpus(k int) func(*placement.Request) { return func(r *placement.Request) { r.GPUCount = k } }

func placer(t interface{ Fatal(...any) }, p placement.Policy) *placement.Placer {
	pl, err := placement.NewPlacer(placement.Options{Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	return pl
}
