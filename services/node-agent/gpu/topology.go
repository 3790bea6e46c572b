package gpu

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// NormalizeBusID writes a PCI bus id as "dddd:bb:dd.f" in lower case, so
// NVML's "00000000:3B:00.0" and the 16-bit domain form "0000:3b:00.0"
// compare equal. An id it cannot parse is returned lower-cased.
func NormalizeBusID(id string) string {
	id = strings.ToLower(strings.TrimSpace(id))
	parts := strings.Split(id, ":")
	if len(parts) != 3 {
		return id
	}
	dom, err1 := strconv.ParseUint(parts[0], 16, 32)
	bus, err2 := strconv.ParseUint(parts[1], 16, 8)
	devfn := strings.Split(parts[2], ".")
	if err1 != nil || err2 != nil || len(devfn) != 2 {
		return id
	}
	dev, err3 := strconv.ParseUint(devfn[0], 16, 8)
	fn, err4 := strconv.ParseUint(devfn[1], 16, 8)
	if err3 != nil || err4 != nil {
		return id
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", dom&0xffff, bus, dev, fn)
}

// Link derives the NVLink topology of devices from their active links: it
// fills each device's NVLinkPeers and returns the NVLink domains. Two GPUs
// are in one domain when a path of NVLinks joins them, directly or through
// NVSwitches; a GPU on an NVSwitch fabric has every other GPU of that
// fabric as a peer. devices must be indexed 0..n-1.
func Link(devices []Device) [][]int {
	n := len(devices)
	byBus := make(map[string]int, n)
	for i, d := range devices {
		byBus[NormalizeBusID(d.PCIBusID)] = i
	}
	parent := make([]int, n)
	for i := range parent {
		parent[i] = i
	}
	find := func(x int) int {
		for parent[x] != x {
			parent[x] = parent[parent[x]]
			x = parent[x]
		}
		return x
	}
	union := func(a, b int) {
		ra, rb := find(a), find(b)
		if ra != rb {
			parent[max(ra, rb)] = min(ra, rb)
		}
	}
	peers := make([]map[int]bool, n)
	for i := range peers {
		peers[i] = map[int]bool{}
	}
	switchGPUs := map[string][]int{} // switch bus id -> GPUs linked to it
	for i, d := range devices {
		for _, l := range d.NVLinks {
			remote := NormalizeBusID(l.RemoteBusID)
			if j, ok := byBus[remote]; ok && !l.RemoteIsSwitch {
				if j != i {
					union(i, j)
					peers[i][j], peers[j][i] = true, true
				}
				continue
			}
			if l.RemoteIsSwitch && !slices.Contains(switchGPUs[remote], i) {
				switchGPUs[remote] = append(switchGPUs[remote], i)
			}
		}
	}
	for _, gpus := range switchGPUs {
		for _, a := range gpus {
			for _, b := range gpus {
				if a != b {
					union(a, b)
					peers[a][b] = true
				}
			}
		}
	}
	for i := range devices {
		ps := make([]int, 0, len(peers[i]))
		for p := range peers[i] {
			ps = append(ps, p)
		}
		slices.Sort(ps)
		devices[i].NVLinkPeers = ps
	}
	groups := map[int][]int{}
	for i := range n {
		r := find(i)
		groups[r] = append(groups[r], i)
	}
	var domains [][]int
	for _, g := range groups {
		if len(g) >= 2 {
			domains = append(domains, g)
		}
	}
	slices.SortFunc(domains, func(a, b []int) int { return a[0] - b[0] })
	return domains
}
