package faults

// preemptionStorm fills the fleet with spot rentals (whole GPUs), then
// bursts on-demand requests for half of it from every publisher at once:
// each victim must be preempted once, stopped within its notice plus
// 2 s, and each preemptor placed.
func preemptionStorm() scenario {
	return scenario{Name: "preemption-storm", Preemption: true, Quiet: true,
		Shape: func(sh *shape, sz size) { sh.Nodes = max(1, sz.Nodes/3) },
		Warm: func(r *run) []string {
			return r.l.burst(r.ctx, "spot", 8*len(r.d.nodes), spotSpec)
		},
		Fault: func(r *run) {
			r.l.burst(r.ctx, "ondemand", 4*len(r.d.nodes), onDemandSpec)
		},
		Check: func(r *run, o observation) {
			r.res.Extra["bad_preemptions_missing"] = float64(max(0, 4*len(r.d.nodes)-r.res.Preempted))
		}}
}
