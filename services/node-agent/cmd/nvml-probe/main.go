// Command nvml-probe prints, as JSON, everything the node agent's NVML
// backend reads on this host: driver and CUDA versions, confidential
// computing state, each GPU (name, model token, UUID, VRAM, PCI bus id, MIG
// mode and instances, NVLink links and peers, capabilities), the NVLink
// domains, two telemetry samples and any Xid/ECC event seen meanwhile.
// With -simulate it probes a simulated profile instead. Exit code 3 means
// no NVIDIA driver was found.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu/nvmlgpu"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu/simgpu"
)

func main() {
	sim := flag.String("simulate", "", "probe a simulated profile instead of the driver")
	interval := flag.Duration("interval", time.Second, "time between the two telemetry samples")
	flag.Parse()
	var (
		h   gpu.Host
		err error
	)
	if *sim != "" {
		var f *simgpu.Fleet
		if f, err = simgpu.New(*sim, 1); err == nil {
			h, err = f.Host()
		}
	} else {
		h, err = nvmlgpu.New(nvml.New())
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "nvml-probe: %v\n", err)
		if errors.Is(err, gpu.ErrNoDriver) {
			os.Exit(3)
		}
		os.Exit(1)
	}
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := nvmlgpu.Probe(ctx, h, *interval, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "nvml-probe: %v\n", err)
		os.Exit(1)
	}
}
