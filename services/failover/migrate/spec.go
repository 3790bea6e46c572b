package migrate

import (
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// ReplacementSpec is the spec a moved rental is placed again with: the
// tenant's own, except that a rental of whole GPUs that named no model
// (any model will do) asks for at least the GPU memory per GPU it ran
// with. A rental that started on 80 GB GPUs must not be moved onto 24 GB
// ones because its tenant left the model open: its workload was sized for
// the memory it got. A rental that named its models keeps exactly those (the
// tenant accepted each of them), a fraction or a MIG instance already
// states its memory. The original model itself is not preferred among the
// models that fit: the scheduler has no preference concept (see
// docs/failover.md). nil when the spec is unknown.
func ReplacementSpec(p Placement) *shizuv1.RentalSpec {
	if p.Spec == nil {
		return nil
	}
	s := proto.CloneOf(p.Spec)
	whole := s.GetMilliGpu() >= 1000
	if whole && len(s.GetAllowedModels()) == 0 && s.GetMigProfile() == "" && p.VRAMMiB > s.GetVramMib() {
		s.VramMib = p.VRAMMiB
	}
	return s
}
