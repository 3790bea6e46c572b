package detect

import (
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func newDetector(t *testing.T) *Detector {
	t.Helper()
	d, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func lostNodes(ds Decisions) []string {
	var out []string
	for _, l := range ds.Lost {
		out = append(out, l.Node)
	}
	return out
}

func TestDetection(t *testing.T) {
	t.Parallel()
	type step struct {
		at  time.Duration
		act func(d *Detector, at time.Time)
	}
	beat := func(node string, epoch uint64) func(*Detector, time.Time) {
		return func(d *Detector, at time.Time) { d.Beat(node, epoch, at) }
	}
	expire := func(node string) func(*Detector, time.Time) {
		return func(d *Detector, at time.Time) { d.Expired(node, at) }
	}
	disconnect := func(node string) func(*Detector, time.Time) {
		return func(d *Detector, at time.Time) { d.Disconnected(node, at) }
	}
	cases := []struct {
		name   string
		steps  []step
		tickAt time.Duration
		want   Reason // ReasonUnknown: not lost
		epoch  uint64
	}{
		{"an expired heartbeat is only suspect within the confirmation window",
			[]step{{0, beat("n1", 3)}, {ms(3000), expire("n1")}}, ms(3400), ReasonUnknown, 0},
		{"an expired heartbeat is a loss once the window passed without a beat",
			[]step{{0, beat("n1", 3)}, {ms(3000), expire("n1")}}, ms(3500), ReasonHeartbeatExpired, 3},
		{"one late heartbeat after the expiry clears the suspicion",
			[]step{{0, beat("n1", 3)}, {ms(3000), expire("n1")}, {ms(3200), beat("n1", 3)}}, ms(5000), ReasonUnknown, 0},
		{"an expiry marker older than the last beat is ignored",
			[]step{{ms(3100), beat("n1", 3)}, {ms(3000), expire("n1")}}, ms(9000), ReasonUnknown, 0},
		{"a disconnect is a loss a grace after the disconnect, long before the TTL",
			[]step{{0, beat("n1", 2)}, {ms(300), disconnect("n1")}}, ms(800), ReasonDisconnected, 2},
		{"a disconnect is only suspect within the grace after it",
			[]step{{0, beat("n1", 2)}, {ms(300), disconnect("n1")}}, ms(700), ReasonUnknown, 0},
		{"a disconnect followed by a beat (a quick reconnect) is no loss",
			[]step{{0, beat("n1", 2)}, {ms(300), disconnect("n1")}, {ms(600), beat("n1", 2)}}, ms(2000), ReasonUnknown, 0},
		{"a node that reports itself failed is lost at once",
			[]step{{0, beat("n1", 4)}, {ms(10), func(d *Detector, at time.Time) { d.Failed("n1", 4, at) }}}, ms(10), ReasonFatalHealth, 4},
		{"a failure report of an older registration is ignored",
			[]step{{0, beat("n1", 4)}, {ms(10), func(d *Detector, at time.Time) { d.Failed("n1", 3, at) }}}, ms(10), ReasonUnknown, 0},
		{"an interruption deadline that passed is a loss",
			[]step{{0, beat("n1", 1)}, {ms(10), func(d *Detector, at time.Time) { d.Interrupted("n1", 1, at.Add(2*time.Second), at) }}, {ms(1000), beat("n1", 1)}},
			ms(2010), ReasonDeadlinePassed, 1},
		{"an interruption before its deadline is no loss",
			[]step{{0, beat("n1", 1)}, {ms(10), func(d *Detector, at time.Time) { d.Interrupted("n1", 1, at.Add(2*time.Second), at) }}},
			ms(2000), ReasonUnknown, 0},
		{"a newer registration voids an expiry of the old one",
			[]step{{0, beat("n1", 1)}, {ms(3000), expire("n1")}, {ms(3100), func(d *Detector, at time.Time) { d.Registered("n1", 2, at) }}},
			ms(5000), ReasonUnknown, 0},
		{"a drained node that goes away is no loss",
			[]step{{0, beat("n1", 2)}, {ms(10), func(d *Detector, at time.Time) { d.Drained("n1", 2, at) }}, {ms(3000), expire("n1")}}, ms(9000), ReasonUnknown, 0},
		{"a beat at a newer epoch voids the failure report of the old one",
			[]step{{0, func(d *Detector, at time.Time) { d.Failed("n1", 1, at) }}, {ms(10), beat("n1", 2)}}, ms(20), ReasonUnknown, 0},
		{"a beat of an older epoch does not clear a suspicion",
			[]step{{0, beat("n1", 5)}, {ms(3000), expire("n1")}, {ms(3100), beat("n1", 4)}}, ms(3500), ReasonHeartbeatExpired, 5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := newDetector(t)
			for _, s := range c.steps {
				s.act(d, t0.Add(s.at))
			}
			got := d.Tick(t0.Add(c.tickAt))
			if c.want == ReasonUnknown {
				if len(got.Lost) != 0 {
					t.Fatalf("lost %+v, want none", got.Lost)
				}
				return
			}
			if len(got.Lost) != 1 || got.Lost[0].Reason != c.want || got.Lost[0].Epoch != c.epoch {
				t.Fatalf("lost %+v, want one %s at epoch %d", got.Lost, c.want, c.epoch)
			}
		})
	}
}

func TestALossIsReportedOncePerEpoch(t *testing.T) {
	t.Parallel()
	d := newDetector(t)
	d.Beat("n1", 1, t0)
	d.Expired("n1", t0.Add(3*time.Second))
	if got := d.Tick(t0.Add(4 * time.Second)); len(got.Lost) != 1 {
		t.Fatalf("first tick lost %v", lostNodes(got))
	}
	d.Beat("n1", 1, t0.Add(5*time.Second)) // the zombie beats on at the fenced epoch
	d.Expired("n1", t0.Add(8*time.Second))
	if got := d.Tick(t0.Add(10 * time.Second)); len(got.Lost) != 0 {
		t.Fatalf("reported again: %v", lostNodes(got))
	}
	d.Registered("n1", 3, t0.Add(11*time.Second))
	d.Expired("n1", t0.Add(14*time.Second))
	got := d.Tick(t0.Add(15 * time.Second))
	if len(got.Lost) != 1 || got.Lost[0].Epoch != 3 {
		t.Fatalf("the new life's loss: %+v", got.Lost)
	}
}

func TestAStormIsReportedWorstFirst(t *testing.T) {
	t.Parallel()
	d := newDetector(t)
	for _, n := range []string{"a", "b", "c", "d"} {
		d.Beat(n, 1, t0)
	}
	d.Expired("a", t0.Add(3*time.Second))
	d.Expired("b", t0.Add(3*time.Second))
	d.Disconnected("c", t0.Add(100*time.Millisecond))
	d.Failed("d", 1, t0.Add(time.Second))
	got := lostNodes(d.Tick(t0.Add(4 * time.Second)))
	want := []string{"d", "c", "a", "b"}
	if len(got) != len(want) {
		t.Fatalf("lost %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("lost %v, want %v", got, want)
		}
	}
}

func TestAFlappingNodeIsQuarantinedWithGrowingBackoff(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := t0
	var epoch uint64 = 1
	d.Registered("n1", epoch, now)
	var quarantines []Quarantine
	var lengths []time.Duration
	for range 5 {
		d.Expired("n1", now.Add(3*time.Second))
		now = now.Add(4 * time.Second)
		if got := d.Tick(now); len(got.Lost) != 1 {
			t.Fatalf("loss not detected at %s", now)
		}
		epoch += 2 // fenced, then registered again
		now = now.Add(time.Second)
		if q, ok := d.Registered("n1", epoch, now); ok {
			quarantines = append(quarantines, q)
			lengths = append(lengths, q.Until.Sub(now))
			if !q.Until.After(now) {
				t.Fatal("quarantine not in force")
			}
		}
	}
	// Losses 3, 4 and 5 within the window: quarantined 1, 2 and 4 minutes.
	if len(quarantines) != 3 {
		t.Fatalf("quarantines %+v, want 3", quarantines)
	}
	for i, want := range []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute} {
		q := quarantines[i]
		if q.Losses != i+3 {
			t.Errorf("quarantine %d counts %d losses, want %d", i, q.Losses, i+3)
		}
		if lengths[i] != want {
			t.Errorf("quarantine %d lasts %s, want %s", i, lengths[i], want)
		}
	}
	last := quarantines[2]
	if got := d.Tick(last.Until.Add(-time.Millisecond)); len(got.Released) != 0 {
		t.Fatalf("released early: %+v", got.Released)
	}
	got := d.Tick(last.Until)
	if len(got.Released) != 1 || got.Released[0].Node != "n1" || got.Released[0].Epoch != epoch {
		t.Fatalf("released %+v, want n1 at epoch %d", got.Released, epoch)
	}
	if again := d.Tick(last.Until.Add(time.Hour)); len(again.Released) != 0 {
		t.Fatalf("still quarantined after release: released again %+v", again.Released)
	}
}

func TestQuarantineBackoffDoublesAndIsCapped(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.FlapThreshold = 1
	cfg.QuarantineBase = time.Minute
	cfg.QuarantineMax = 3 * time.Minute
	cfg.FlapWindow = time.Hour
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := t0
	epoch := uint64(1)
	d.Registered("n1", epoch, now)
	var got []time.Duration
	for range 4 {
		d.Failed("n1", epoch, now)
		d.Tick(now)
		epoch++
		q, ok := d.Registered("n1", epoch, now)
		if !ok {
			t.Fatal("not quarantined")
		}
		got = append(got, q.Until.Sub(now))
	}
	want := []time.Duration{time.Minute, 2 * time.Minute, 3 * time.Minute, 3 * time.Minute}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("backoffs %v, want %v", got, want)
		}
	}
}

func TestLossesOutsideTheFlapWindowAreForgotten(t *testing.T) {
	t.Parallel()
	d := newDetector(t)
	now := t0
	epoch := uint64(1)
	d.Registered("n1", epoch, now)
	for range 5 {
		d.Failed("n1", epoch, now)
		d.Tick(now)
		epoch++
		now = now.Add(6 * time.Minute) // two losses at most inside 10 minutes
		if _, ok := d.Registered("n1", epoch, now); ok {
			t.Fatalf("quarantined at %s though losses were spread out", now)
		}
	}
}

func TestNextWakeIsTheEarliestPendingDecision(t *testing.T) {
	t.Parallel()
	d := newDetector(t)
	if !d.NextWake(t0).IsZero() {
		t.Fatal("wake with nothing pending")
	}
	d.Beat("n1", 1, t0)
	d.Expired("n1", t0.Add(3*time.Second))
	d.Beat("n2", 1, t0.Add(2*time.Second))
	d.Disconnected("n2", t0.Add(2800*time.Millisecond))
	if got, want := d.NextWake(t0.Add(3*time.Second)), t0.Add(3300*time.Millisecond); !got.Equal(want) {
		t.Fatalf("next wake %s, want %s (the disconnect grace)", got, want)
	}
}

func TestClientNamesOfAgentsNameTheirNode(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]string{"node-agent:gpu-1": "gpu-1", "node-agent": "", "scheduler": "", "node-agent:a.b": "", "node-agent:": ""} {
		got, ok := NodeFromClientName(name)
		if got != want || ok != (want != "") {
			t.Errorf("NodeFromClientName(%q) = %q, %v; want %q", name, got, ok, want)
		}
	}
}

func TestConfigProblemsAreAllReported(t *testing.T) {
	t.Parallel()
	_, err := New(Config{Confirm: -1})
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"confirm", "disconnect_grace", "flap_window", "flap_threshold", "quarantine"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

// A node that keeps beating within its TTL is never declared lost, whatever
// expiries, slow beats and ticks interleave; and a node that stops beating
// is always declared lost exactly once.
func TestPropertyLivenessAndSafety(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		d, err := New(DefaultConfig())
		if err != nil {
			rt.Fatal(err)
		}
		now := t0
		d.Beat("n", 1, now)
		steps := rapid.IntRange(1, 50).Draw(rt, "steps")
		for range steps {
			gap := time.Duration(rapid.IntRange(1, 2900).Draw(rt, "gap")) * time.Millisecond
			// A spurious expiry marker that predates the next beat.
			if rapid.Bool().Draw(rt, "stale-expiry") {
				d.Expired("n", now.Add(gap/2))
			}
			now = now.Add(gap)
			d.Beat("n", 1, now)
			if got := d.Tick(now); len(got.Lost) != 0 {
				rt.Fatalf("a beating node was declared lost at %s", now)
			}
		}
		stopped := now
		d.Expired("n", stopped.Add(3*time.Second))
		lost := 0
		for i := range 20 {
			lost += len(d.Tick(stopped.Add(3*time.Second + time.Duration(i)*100*time.Millisecond)).Lost)
		}
		if lost != 1 {
			rt.Fatalf("a silent node was declared lost %d times", lost)
		}
	})
}

func TestAFlappingNodeSeenFirstInABeatIsQuarantinedAtItsRegistration(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.FlapThreshold = 1
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d.Registered("n1", 1, t0)
	d.Failed("n1", 1, t0)
	d.Tick(t0)
	// The new epoch's first beat reaches this replica before its
	// registration does.
	d.Beat("n1", 2, t0.Add(time.Second))
	q, ok := d.Registered("n1", 2, t0.Add(1100*time.Millisecond))
	if !ok || q.Epoch != 2 || !q.Until.Equal(t0.Add(time.Second+cfg.QuarantineBase)) {
		t.Fatalf("quarantine %+v, %v; want epoch 2 from the beat", q, ok)
	}
	if _, again := d.Registered("n1", 2, t0.Add(2*time.Second)); again {
		t.Fatal("the same quarantine was announced twice")
	}
}

func TestADisconnectSeenBeforeTheBeatAnnouncingTheEpochStillCounts(t *testing.T) {
	t.Parallel()
	d, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 6, 18, 12, 0, 0, 0, time.UTC)
	// The advisory overtakes the heartbeat watch: the node's epoch is not
	// known yet, so nothing can be fenced.
	d.Disconnected("n1", t0.Add(100*time.Millisecond))
	if got := d.Tick(t0.Add(10 * time.Second)); len(got.Lost) != 0 {
		t.Fatalf("lost %v before the node's epoch was known", got.Lost)
	}
	// The beat (stamped before the disconnect) arrives: the disconnect is
	// of this life and the node is lost with its epoch.
	d.Beat("n1", 1, t0)
	got := d.Tick(t0.Add(10 * time.Second))
	if len(got.Lost) != 1 || got.Lost[0].Epoch != 1 || got.Lost[0].Reason != ReasonDisconnected {
		t.Fatalf("lost %+v, want n1 at epoch 1 by disconnect", got.Lost)
	}
}

func TestLossesDueSoonAreTheOnesAboutToBeConfirmed(t *testing.T) {
	t.Parallel()
	d := newDetector(t)
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		d.Beat(n, 1, t0)
	}
	d.Disconnected("a", t0.Add(100*time.Millisecond)) // due at 600 ms
	d.Disconnected("b", t0.Add(130*time.Millisecond)) // due at 630 ms
	d.Disconnected("c", t0.Add(900*time.Millisecond)) // due at 1400 ms: too late
	d.Disconnected("e", t0.Add(110*time.Millisecond))
	d.Beat("e", 1, t0.Add(300*time.Millisecond))      // reconnected: no loss coming
	d.Disconnected("x", t0.Add(100*time.Millisecond)) // epoch unknown: cannot be fenced
	now := t0.Add(600 * time.Millisecond)
	if got := lostNodes(d.Tick(now)); len(got) != 1 || got[0] != "a" {
		t.Fatalf("lost %v at 600 ms, want a", got)
	}
	if got, want := d.LossesDueBy(now, now.Add(100*time.Millisecond)), t0.Add(630*time.Millisecond); !got.Equal(want) {
		t.Fatalf("losses due by %s, want b's at %s", got, want)
	}
	if got := d.LossesDueBy(now, now.Add(20*time.Millisecond)); !got.IsZero() {
		t.Fatalf("losses due within 20 ms: %s, want none", got)
	}
}
