package runtime

import (
	"testing"
	"time"
)

func TestAStopIsItsStartPlusTheBootClocksElapsedTimeAndNeverBeforeTheStart(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	stepped := start.Add(-time.Hour) // the wall clock now, stepped back an hour
	p := &Process{now: func() time.Time { return stepped }, mono: func() time.Duration { return 12 * time.Second }, boot: "boot-b"}
	tests := []struct {
		name string
		rec  record
		want time.Time
	}{
		{"in the same boot, the start plus what the boot clock measured", record{StartedAt: start, StartedBoot: 10 * time.Second, BootID: "boot-b"},
			start.Add(2 * time.Second)},
		{"after a reboot the wall clock stands in, never before the start", record{StartedAt: start, StartedBoot: 10 * time.Second, BootID: "boot-a"},
			start},
		{"a record from before boot times the same", record{StartedAt: start}, start},
		{"a boot clock behind the start's is not trusted", record{StartedAt: start, StartedBoot: 20 * time.Second, BootID: "boot-b"}, start},
	}
	for _, tc := range tests {
		if got := p.stoppedAt(tc.rec); !got.Equal(tc.want) {
			t.Errorf("%s: stopped at %v, want %v", tc.name, got, tc.want)
		}
	}
}
