package shizuv1

import "fmt"

// Bounds of a RentalLogBatch. The node-agent cuts longer lines (marking
// them truncated) and starts a new batch before MaxLogBatchLines.
const (
	// MaxLogLineBytes is the longest LogLine.text.
	MaxLogLineBytes = 16 << 10
	// MaxLogBatchLines is the most lines of one batch.
	MaxLogBatchLines = 1000
)

// Validate checks a log batch: the rental header, the node, an attempt >=
// 1, a non-negative offset and drop count, at most MaxLogBatchLines lines
// each with its read time and at most MaxLogLineBytes, and that the batch
// says something (a line, a drop count or the end of the output).
func (m *RentalLogBatch) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.rentalHeader(m.GetMeta(), m.GetRentalId(), m.GetTenantId())
	p.token("node_id", m.GetNodeId())
	p.attempt(m.GetAttempt())
	p.nonNegative("offset", m.GetOffset())
	p.nonNegative("dropped_lines", m.GetDroppedLines())
	lines := m.GetLines()
	if len(lines) > MaxLogBatchLines {
		p.addf("lines", "%d lines, the limit is %d", len(lines), MaxLogBatchLines)
	}
	for i, l := range lines {
		path := fmt.Sprintf("lines[%d]", i)
		p.timestamp(path+".read_at", l.GetReadAt())
		if n := len(l.GetText()); n > MaxLogLineBytes {
			p.addf(path+".text", "%d bytes, the limit is %d", n, MaxLogLineBytes)
		}
	}
	if len(lines) == 0 && m.GetDroppedLines() == 0 && !m.GetEndOfOutput() {
		p.addf("lines", "empty, with no dropped lines and not the end of the output: the batch says nothing")
	}
	return p.err()
}
