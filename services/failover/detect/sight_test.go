package detect

import (
	"slices"
	"testing"
	"time"
)

// outage drives two nodes beating every second (3 s TTL, default config)
// through a NATS outage from 1.5 s (failover's connection drops) to back
// (failover watches again); a beats again at back+0.4 s, b died during the
// outage and never does. markers says whether failover sees the expiries
// the restarted server writes (a watch that replays them) or not (they
// came and went unseen).
func outage(t *testing.T, back time.Duration, markers bool) *Detector {
	t.Helper()
	d := newDetector(t)
	for at := time.Duration(0); at <= time.Second; at += time.Second {
		d.Beat("a", 1, t0.Add(at))
		d.Beat("b", 1, t0.Add(at))
	}
	d.Unobserved(t0.Add(ms(1500)))
	if back > 4*time.Second && markers {
		// The server expires both keys while it is down: the markers come
		// when it restarts, stamped then.
		d.Expired("a", t0.Add(back-ms(100)))
		d.Expired("b", t0.Add(back-ms(100)))
	}
	if ds := d.Tick(t0.Add(back - ms(50))); len(ds.Lost) != 0 {
		t.Fatalf("lost %v while failover could not see the heartbeats", lostNodes(ds))
	}
	d.Observed(t0.Add(back))
	if back <= 4*time.Second {
		d.Expired("b", t0.Add(4*time.Second)) // its key expires after the outage, one TTL after its last beat
	}
	d.Beat("a", 1, t0.Add(back+ms(400)))
	return d
}

func TestANATSOutageLongerThanTheTTLLosesOnlyTheNodeThatDidNotBeatAgainWithinTheGrace(t *testing.T) {
	t.Parallel()
	const back = 6500 * time.Millisecond // a 5 s outage
	for _, markers := range []bool{true, false} {
		d := outage(t, back, markers)
		graceEnds := t0.Add(back + DefaultConfig().Grace)
		if ds := d.Tick(graceEnds.Add(-ms(1))); len(ds.Lost) != 0 {
			t.Fatalf("markers %v: lost %v within the grace after the reconnect", markers, lostNodes(ds))
		}
		if next := d.NextWake(t0.Add(back + ms(500))); !next.Equal(graceEnds) {
			t.Fatalf("markers %v: next wake %s, want the grace's end %s", markers, next, graceEnds)
		}
		ds := d.Tick(graceEnds)
		if got := lostNodes(ds); !slices.Equal(got, []string{"b"}) {
			t.Fatalf("markers %v: lost %v at the grace's end, want [b] (a beat again)", markers, got)
		}
		if l := ds.Lost[0]; l.Reason != ReasonHeartbeatExpired || !l.LastBeat.Equal(t0.Add(time.Second)) {
			t.Fatalf("markers %v: loss %+v, want heartbeat_expired with the last beat before the outage", markers, l)
		}
	}
}

func TestANATSOutageShorterThanTheTTLStillGivesEveryNodeTheGrace(t *testing.T) {
	t.Parallel()
	const back = 2700 * time.Millisecond // a 1.2 s outage
	d := outage(t, back, true)
	graceEnds := t0.Add(back + DefaultConfig().Grace)
	// b's key expired at 4 s: lost at 4.5 s without the outage, but the
	// grace after the reconnect runs to 5.7 s.
	if ds := d.Tick(graceEnds.Add(-ms(1))); len(ds.Lost) != 0 {
		t.Fatalf("lost %v within the grace", lostNodes(ds))
	}
	if got := lostNodes(d.Tick(graceEnds)); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("lost %v, want [b]", got)
	}
}

func TestWhileBlindOnlyAPositiveSignalLosesANode(t *testing.T) {
	t.Parallel()
	d := newDetector(t)
	d.Beat("a", 1, t0)
	d.Beat("b", 1, t0)
	d.Beat("c", 1, t0)
	d.Expired("a", t0.Add(3*time.Second))
	d.Unobserved(t0.Add(3100 * time.Millisecond))
	d.Disconnected("b", t0.Add(3200*time.Millisecond))
	d.Failed("c", 1, t0.Add(3300*time.Millisecond))
	if got := lostNodes(d.Tick(t0.Add(10 * time.Second))); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("lost %v while blind, want only the node that reported itself failed", got)
	}
	if next := d.NextWake(t0.Add(10 * time.Second)); !next.IsZero() {
		t.Fatalf("next wake %s while blind, want none (Observed wakes the caller)", next)
	}
	d.Unobserved(t0.Add(11 * time.Second)) // still the same blind period
	d.Observed(t0.Add(12 * time.Second))
	graceEnds := t0.Add(12*time.Second + DefaultConfig().Grace)
	if ds := d.Tick(graceEnds.Add(-ms(1))); len(ds.Lost) != 0 {
		t.Fatalf("lost %v within the grace", lostNodes(ds))
	}
	if got := lostNodes(d.Tick(graceEnds)); !slices.Equal(got, []string{"b", "a"}) {
		t.Fatalf("lost %v after the grace, want the disconnected b, then the expired a", got)
	}
}
