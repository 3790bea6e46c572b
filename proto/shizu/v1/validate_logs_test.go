package shizuv1

import (
	"strings"
	"testing"
	"time"
)

func validRentalLogBatch() *RentalLogBatch {
	return &RentalLogBatch{
		Meta:     with(validMeta(), func(m *EventMeta) { m.EventId = "log:r-42:1:0"; m.Source = "node-agent/gpu-node-17" }),
		RentalId: "r-42",
		TenantId: "acme",
		NodeId:   "gpu-node-17",
		Attempt:  1,
		Lines: []*LogLine{
			{ReadAt: at(time.Second), Text: "epoch 1/10"},
			{ReadAt: at(2 * time.Second), Text: strings.Repeat("x", MaxLogLineBytes), Truncated: true},
		},
	}
}

func TestLogBatchesAreValidatedWithTheFieldPath(t *testing.T) {
	tests := []struct {
		name string
		msg  *RentalLogBatch
		want string
	}{
		{"a batch without an attempt is rejected", with(validRentalLogBatch(), func(m *RentalLogBatch) { m.Attempt = 0 }), "attempt: 0"},
		{"a batch with a negative offset is rejected", with(validRentalLogBatch(), func(m *RentalLogBatch) { m.Offset = -1 }), "offset: -1 is negative"},
		{"a batch with a negative drop count is rejected", with(validRentalLogBatch(), func(m *RentalLogBatch) { m.DroppedLines = -3 }), "dropped_lines: -3 is negative"},
		{"a line without a read time is rejected", with(validRentalLogBatch(), func(m *RentalLogBatch) { m.Lines[1].ReadAt = nil }), "lines[1].read_at: missing"},
		{"a line over the cap is rejected", with(validRentalLogBatch(), func(m *RentalLogBatch) { m.Lines[0].Text = strings.Repeat("y", MaxLogLineBytes+1) }),
			"lines[0].text: 16385 bytes, the limit is 16384"},
		{"a batch of too many lines is rejected", with(validRentalLogBatch(), func(m *RentalLogBatch) {
			for range MaxLogBatchLines {
				m.Lines = append(m.Lines, &LogLine{ReadAt: at(0), Text: "z"})
			}
		}), "lines: 1002 lines, the limit is 1000"},
		{"a batch that says nothing is rejected", with(validRentalLogBatch(), func(m *RentalLogBatch) { m.Lines = nil }), "lines: empty"},
		{"a batch on a tenant with a dot is rejected", with(validRentalLogBatch(), func(m *RentalLogBatch) { m.TenantId = "a.b" }), "tenant_id: "},
		{"a batch without a node is rejected", with(validRentalLogBatch(), func(m *RentalLogBatch) { m.NodeId = "" }), "node_id: missing"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { wantProblem(t, tc.msg.Validate(), tc.want) })
	}
}

func TestALogBatchMayCarryOnlyADropCountOrTheEndOfTheOutput(t *testing.T) {
	for _, m := range []*RentalLogBatch{
		with(validRentalLogBatch(), func(m *RentalLogBatch) { m.Lines, m.DroppedLines = nil, 1200 }),
		with(validRentalLogBatch(), func(m *RentalLogBatch) { m.Lines, m.EndOfOutput = nil, true }),
	} {
		if err := m.Validate(); err != nil {
			t.Errorf("Validate(%v) = %v, want nil", m, err)
		}
	}
}
