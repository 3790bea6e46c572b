package shizuv1

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func TestTruncateNeverSplitsARuneAndAlwaysEncodes(t *testing.T) {
	bar := strings.Repeat("█", 400) // 3 bytes each: a tqdm progress bar
	tests := []struct {
		name string
		in   string
		max  int
		want string
	}{
		{"a short string is kept whole", "exit 0", 1024, "exit 0"},
		{"an ASCII string is cut at the byte limit", "abcdef", 4, "abcd"},
		{"a cut inside a three-byte rune drops the whole rune", "ab█", 4, "ab"},
		{"a cut on a rune boundary keeps the rune", "ab█", 5, "ab█"},
		{"invalid UTF-8 is replaced before cutting", "ok\xff\xfe", 64, "ok\uFFFD"},
		{"a zero limit gives the empty string", "abc", 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Truncate(tt.in, tt.max); got != tt.want {
				t.Fatalf("Truncate(%q, %d) = %q, want %q", tt.in, tt.max, got, tt.want)
			}
		})
	}
	for n := range 40 {
		got := Truncate(bar, 1000+n)
		if !utf8.ValidString(got) || len(got) > 1000+n {
			t.Fatalf("Truncate(bar, %d): %d bytes, valid %v", 1000+n, len(got), utf8.ValidString(got))
		}
		ev := &RentalStopped{Meta: NewMeta("e", "node-agent/n1", "", "r1", time.Unix(0, 0)), Message: got}
		if _, err := proto.Marshal(ev); err != nil {
			t.Fatalf("a truncated progress bar does not encode: %v", err)
		}
	}
}

func TestNewMetaFillsEveryField(t *testing.T) {
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	m := NewMeta("id", "scheduler", "cause", "rental-1", at)
	if m.GetEventId() != "id" || m.GetSource() != "scheduler" || m.GetCausationId() != "cause" ||
		m.GetCorrelationId() != "rental-1" || !m.GetOccurredAt().AsTime().Equal(at) {
		t.Fatalf("NewMeta = %v", m)
	}
}

func TestClampStopMovesOnlyAStopBeforeItsStart(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 11, 2, 9, 0, 15, 0, time.UTC)
	for _, c := range []struct {
		name    string
		stop    time.Time
		clamped bool
		want    time.Time
	}{
		{"before the start", start.Add(-10 * time.Second), true, start},
		{"at the start", start, false, start},
		{"after the start", start.Add(time.Minute), false, start.Add(time.Minute)},
	} {
		ev := &RentalStopped{StartedAt: timestamppb.New(start), StoppedAt: timestamppb.New(c.stop)}
		if got := ClampStop(ev); got != c.clamped || !ev.GetStoppedAt().AsTime().Equal(c.want) {
			t.Errorf("%s: clamped %v, stopped_at %s; want %v, %s", c.name, got, ev.GetStoppedAt().AsTime(), c.clamped, c.want)
		}
	}
	if ClampStop(&RentalStopped{StartedAt: timestamppb.New(start)}) {
		t.Error("a stop without stopped_at was clamped (validation must refuse it)")
	}
}
