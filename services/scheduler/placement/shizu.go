package placement

// Shizu's policy (PolicyShizu) is FGD that keeps whole GPUs whole. It is
// experimental: on the Alibaba trace (services/scheduler/replay, README
// there) it leaves fewer GPUs unallocated than FGD on 13 of 20 variants but
// more on the share-heavy ones, so the service's default stays fgd.
// At 100 % arrived almost every idle GPU left by FGD is a sliver of a
// shared GPU; most of it comes from fractions that opened a fresh GPU while
// an already-shared GPU elsewhere could have taken them. So a fraction goes
// to an already-shared GPU whenever one fits anywhere in the cluster (the
// tightest such GPU first, best-fit bin packing), and only otherwise opens a
// whole GPU, chosen by FGD. Whole-GPU and CPU-only requests are ranked by
// FGD unchanged, with the same tie order.

// shizuSharedBonus lifts a shared GPU above every FGD score (0..100).
const shizuSharedBonus = 1000

// shizuTightStep is the milli-GPU per point of the tightness bonus.
const shizuTightStep = 10

// shizuGPUScore is the Shizu score of putting a fraction of milli on GPU g
// whose FGD score is fgd: a shared GPU (free < 1000) scores
// 1000 + (1000 − left)/10, where left is what it keeps free afterwards; a
// whole GPU scores its FGD score.
func shizuGPUScore(fgd int64, g *GPU, milli int64) int64 {
	if g.FreeMilli >= MilliPerGPU {
		return fgd
	}
	return fgd + shizuSharedBonus + (MilliPerGPU-(g.FreeMilli-milli))/shizuTightStep
}
