package e2e

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// testStack is the stack of every scenario here: 2 s usage records closed
// 6 s after each boundary (longer than a partition takes to be detected:
// last beat + 3 s TTL + 0.5 s confirmation).
func testStack(t testing.TB) *stack {
	return newStack(t, stackConfig{MeterInterval: 2 * time.Second, CloseGrace: 6 * time.Second})
}

// chaosResult is what one SIGKILL round measured, from the kill.
type chaosResult struct {
	detect, handedOver, scheduled, running, downtime []time.Duration
	// movedTwice counts rentals first placed again on another killed node
	// not yet found lost, which moved again from there.
	movedTwice int
}

// victims are the k nodes holding the most rentals.
func (s *stack) victims(k int) []string {
	s.t.Helper()
	type load struct {
		node string
		n    int
	}
	var loads []load
	for _, n := range s.nodes {
		allocs, err := s.store.Allocations(s.t.Context(), n)
		if err != nil {
			s.t.Fatal(err)
		}
		loads = append(loads, load{n, len(allocs)})
	}
	slices.SortStableFunc(loads, func(a, b load) int { return cmp.Compare(b.n, a.n) })
	var out []string
	for _, l := range loads[:k] {
		out = append(out, l.node)
	}
	return out
}

// affected maps each rental allocated on nodes to its node.
func (s *stack) affected(nodes []string) map[string]string {
	s.t.Helper()
	out := map[string]string{}
	for _, n := range nodes {
		allocs, err := s.store.Allocations(s.t.Context(), n)
		if err != nil {
			s.t.Fatal(err)
		}
		for _, a := range allocs {
			out[a.RentalID] = n
		}
	}
	return out
}

// waitMoved waits until every affected rental runs again (a later attempt
// started on a node not lost) and failover has completed the move
// (RentalMigrated).
func (s *stack) waitMoved(affected map[string]string, lost []string) {
	s.t.Helper()
	s.eventually(90*time.Second, func() error {
		left := 0
		var states []string
		s.rec.mu.Lock()
		for r := range affected {
			if st := s.rec.latest(r); st == nil || st.GetAttempt() < 2 || slices.Contains(lost, st.GetNodeId()) || len(s.rec.migrated[r]) == 0 {
				left++
				states = append(states, fmt.Sprintf("%s: migrating %d, scheduled %d, started %d, migrated %d, pending %q",
					r, len(s.rec.migrating[r]), len(s.rec.scheduled[r]), len(s.rec.started[r]), len(s.rec.migrated[r]),
					s.rec.pending[r].GetReason().String()+" "+s.rec.pending[r].GetMessage()))
			}
		}
		s.rec.mu.Unlock()
		if left > 0 {
			slices.Sort(states)
			if len(states) > 8 {
				states = states[:8]
			}
			return fmt.Errorf("%d of %d affected rentals not running again elsewhere and migrated; %s", left, len(affected), strings.Join(states, "; "))
		}
		return nil
	})
}

// latest is the rental's latest started attempt (nil when none); the
// caller holds r.mu.
func (r *recorder) latest(rental string) *shizuv1.RentalStarted {
	var out *shizuv1.RentalStarted
	for a, st := range r.started[rental] {
		if out == nil || a > out.GetAttempt() {
			out = st
		}
	}
	return out
}

// checkMoves checks each affected rental's moves event by event. Nodes
// killed at once are found one after the other, so a rental may first be
// placed on another killed node not yet found lost, and move again from
// there: each RentalMigrating leaves a lost node, attempt k -> k+1 in
// turn; every attempt but the last was placed on a lost node and never
// started; the last is scheduled on a live node, started there, and
// RentalMigrated names that node with a downtime that starts at the last
// beat before lostAt. No rental moved that was not affected, and none was
// placed after its last move.
func (s *stack) checkMoves(affected map[string]string, lost []string, lostAt time.Time, res *chaosResult) {
	t := s.t
	t.Helper()
	// A node's last beat came at most its beat interval before the loss
	// (and a second for the beat to be seen): 2 s at the default.
	beatWindow := defaultBeat
	for _, n := range lost {
		beatWindow = max(beatWindow, s.beatInterval(n))
	}
	beatWindow += time.Second
	s.rec.mu.Lock()
	defer s.rec.mu.Unlock()
	for r, from := range affected {
		ms := slices.Clone(s.rec.migrating[r])
		slices.SortFunc(ms, func(a, b *shizuv1.RentalMigrating) int { return cmp.Compare(a.GetFromAttempt(), b.GetFromAttempt()) })
		if len(ms) == 0 {
			t.Errorf("%s: no RentalMigrating", r)
			continue
		}
		node := from
		for k, m := range ms {
			attempt := int32(k + 1)
			if m.GetFromNodeId() != node || m.GetFromAttempt() != attempt || m.GetNextAttempt() != attempt+1 || m.GetLastHeartbeatAt() == nil {
				t.Errorf("%s: move %d: RentalMigrating from %s attempt %d -> %d (last beat %v), want from %s %d -> %d with the last beat",
					r, k+1, m.GetFromNodeId(), m.GetFromAttempt(), m.GetNextAttempt(), m.GetLastHeartbeatAt(), node, attempt, attempt+1)
			}
			sc := s.rec.scheduled[r][attempt+1]
			if sc == nil {
				t.Errorf("%s: attempt %d never scheduled", r, attempt+1)
				break
			}
			// The scheduler re-queues the move as a request caused by the
			// migrating event, and the placement is caused by that request.
			if c := sc.GetMeta().GetCausationId(); c != m.GetMeta().GetEventId() && c != fmt.Sprintf("rental:%s:requeued:%d", r, attempt+1) {
				t.Errorf("%s: attempt %d caused by %q, want the migrating event %q (or its re-queued request)", r, attempt+1, c, m.GetMeta().GetEventId())
			}
			if k < len(ms)-1 {
				if !slices.Contains(lost, sc.GetNodeId()) || s.rec.started[r][attempt+1] != nil {
					t.Errorf("%s: attempt %d on %s moved again, but that node was not lost or it ran there", r, attempt+1, sc.GetNodeId())
				}
				node = sc.GetNodeId()
			}
		}
		last := ms[len(ms)-1]
		final := last.GetNextAttempt()
		sc, st := s.rec.scheduled[r][final], s.rec.started[r][final]
		if sc == nil || st == nil {
			t.Errorf("%s: attempt %d scheduled %v started %v", r, final, sc != nil, st != nil)
			continue
		}
		if slices.Contains(lost, sc.GetNodeId()) || st.GetNodeId() != sc.GetNodeId() {
			t.Errorf("%s: attempt %d scheduled on %s, started on %s; lost nodes %v", r, final, sc.GetNodeId(), st.GetNodeId(), lost)
		}
		if s.rec.scheduled[r][final+1] != nil || s.rec.started[r][final+1] != nil {
			t.Errorf("%s placed again after its last move", r)
		}
		if len(s.rec.migrated[r]) == 0 {
			t.Errorf("%s: no RentalMigrated", r)
			continue
		}
		mg := s.rec.migrated[r][len(s.rec.migrated[r])-1]
		down := mg.GetDowntime().AsDuration()
		if !slices.Contains(lost, mg.GetFromNodeId()) || mg.GetToNodeId() != st.GetNodeId() || down <= 0 {
			t.Errorf("%s: RentalMigrated %s -> %s downtime %s, want a lost node -> %s and a downtime", r, mg.GetFromNodeId(), mg.GetToNodeId(), down, st.GetNodeId())
		}
		// The downtime runs from the last sign of life, which came before
		// the loss (at most a beat interval before), to the new start.
		lastLife := st.GetStartedAt().AsTime().Add(-down)
		if lastLife.After(lostAt.Add(50*time.Millisecond)) || lastLife.Before(lostAt.Add(-beatWindow)) {
			t.Errorf("%s: downtime %s starts at %s, the node was lost at %s", r, down, lastLife.Format(time.StampMilli), lostAt.Format(time.StampMilli))
		}
		beats := false
		for _, m := range ms {
			d := m.GetLastHeartbeatAt().AsTime().Sub(lastLife)
			beats = beats || (d < time.Millisecond && d > -time.Millisecond)
		}
		if !beats {
			t.Errorf("%s: downtime starts at %s, no last beat of a node it left", r, lastLife.Format(time.StampMilli))
		}
		if res != nil {
			res.handedOver = append(res.handedOver, s.rec.handedAt[r].Sub(lostAt))
			res.scheduled = append(res.scheduled, sc.GetMeta().GetOccurredAt().AsTime().Sub(lostAt))
			res.running = append(res.running, st.GetStartedAt().AsTime().Sub(lostAt))
			res.downtime = append(res.downtime, down)
			if len(ms) > 1 {
				res.movedTwice++
			}
		}
	}
	for r := range s.rec.migrating {
		if _, ok := affected[r]; !ok {
			t.Errorf("%s moved, but its node was not lost", r)
		}
	}
	for _, n := range lost {
		if len(s.rec.lost[n]) != 1 {
			t.Errorf("%s: %d NodeLost, want 1", n, len(s.rec.lost[n]))
			continue
		}
		if res != nil {
			res.detect = append(res.detect, s.rec.lost[n][0].GetMeta().GetOccurredAt().AsTime().Sub(lostAt))
		}
	}
}

// checkBooks: every rental holds exactly one allocation, on the node its
// latest attempt started on (none on the dead nodes); every GPU's free
// share is its size minus what its allocations hold; and exactly one
// workload process runs per rental, its latest attempt.
func (s *stack) checkBooks(rentals []string, dead []string) {
	t := s.t
	t.Helper()
	snap, err := s.store.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	latest := map[string]*shizuv1.RentalStarted{}
	s.rec.mu.Lock()
	for _, r := range rentals {
		for a, st := range s.rec.started[r] {
			if latest[r] == nil || a > latest[r].GetAttempt() {
				latest[r] = st
			}
		}
	}
	s.rec.mu.Unlock()
	seen := map[string]string{}
	for _, n := range snap.Nodes {
		used := make([]int64, len(n.GPUs))
		sharers := make([]int, len(n.GPUs))
		for _, a := range n.Allocations {
			if prev, dup := seen[a.RentalID]; dup {
				t.Errorf("%s allocated on %s and %s", a.RentalID, prev, n.ID)
			}
			seen[a.RentalID] = n.ID
			if slices.Contains(dead, n.ID) {
				t.Errorf("%s still allocated on dead node %s", a.RentalID, n.ID)
			}
			if st := latest[a.RentalID]; st == nil || st.GetNodeId() != n.ID {
				t.Errorf("%s allocated on %s, its latest run started on %s", a.RentalID, n.ID, st.GetNodeId())
			}
			for _, g := range a.GPUs {
				used[g.Index] += g.Milli
				sharers[g.Index]++
			}
		}
		for i, g := range n.FreeGPUs {
			if g.Milli != capacity.MilliPerGPU-used[i] {
				t.Errorf("%s GPU %d: %d milli free, its allocations hold %d of %d", n.ID, i, g.Milli, used[i], capacity.MilliPerGPU)
			}
			if g.Sharers != sharers[i] {
				t.Errorf("%s GPU %d: %d sharers counted, %d allocations on it", n.ID, i, g.Sharers, sharers[i])
			}
		}
	}
	for _, r := range rentals {
		if _, ok := seen[r]; !ok {
			t.Errorf("%s holds no allocation", r)
		}
	}
	if len(seen) != len(rentals) {
		t.Errorf("%d rentals allocated, want %d", len(seen), len(rentals))
	}
}

// waitOneRunEach waits until exactly one workload process runs per rental,
// of its latest attempt (a killed agent's workloads end with it; a fenced
// one's are stopped by its agent).
func (s *stack) waitOneRunEach(rentals []string) {
	s.t.Helper()
	s.eventually(30*time.Second, func() error {
		runs := s.runs()
		for _, r := range rentals {
			s.rec.mu.Lock()
			want := strconv.Itoa(int(s.rec.latest(r).GetAttempt()))
			s.rec.mu.Unlock()
			if got := runs[r]; len(got) != 1 || got[0] != want {
				return fmt.Errorf("%s: workloads of attempts %v run, want only attempt %s", r, got, want)
			}
		}
		return nil
	})
}

// waitBilled waits until metering has published a usage record of every
// rental: each has run past an interval boundary and its node has beaten
// since it started (see TestARentalWhoseNodeDiesBeforeItsNextBeatIsBilledNothingOnIt).
func (s *stack) waitBilled(rentals []string) {
	s.t.Helper()
	s.eventually(60*time.Second, func() error {
		usage := s.usage()
		for _, r := range rentals {
			if len(usage[r]) == 0 {
				return fmt.Errorf("no usage record of %s yet", r)
			}
		}
		return nil
	})
}

// waitMeteringCaughtUp waits until metering has handled every rental event
// stored so far, and every moved rental has a usage record of its new run.
func (s *stack) waitMeteringCaughtUp(affected map[string]string) {
	s.t.Helper()
	s.eventually(60*time.Second, func() error {
		svc, _ := topology.ServiceNamed(topology.Metering)
		for _, c := range svc.Consumers {
			if c.Stream != topology.StreamRentals {
				continue
			}
			cons, err := s.js.Consumer(s.t.Context(), c.Stream, c.Durable)
			if err != nil {
				return err
			}
			info, err := cons.Info(s.t.Context())
			if err != nil {
				return err
			}
			if info.NumPending > 0 || info.NumAckPending > 0 {
				return fmt.Errorf("metering has %d rental events pending, %d unacknowledged", info.NumPending, info.NumAckPending)
			}
		}
		usage := s.usage()
		for r := range affected {
			s.rec.mu.Lock()
			st := s.rec.latest(r)
			s.rec.mu.Unlock()
			found := false
			for _, u := range usage[r] {
				found = found || u.GetNodeId() == st.GetNodeId()
			}
			if !found {
				return fmt.Errorf("no usage record of %s's new run on %s yet", r, st.GetNodeId())
			}
		}
		return nil
	})
}

// checkBills: no rental is billed twice for any instant (its records'
// intervals never overlap); a moved rental's records on the node it left
// lie between its first start and the last heartbeat (nothing for the dead
// interval, nothing for a fenced run that went on) or, for a
// make-before-break move, the hand-over (RentalMigrating), and those on
// its new node start at the new run's start; and each record bills no
// more whole seconds than its interval spans.
func (s *stack) checkBills(rentals []string, affected map[string]string) {
	t := s.t
	t.Helper()
	usage := s.usage()
	s.rec.mu.Lock()
	defer s.rec.mu.Unlock()
	for _, r := range rentals {
		recs := slices.Clone(usage[r])
		if len(recs) == 0 {
			t.Errorf("%s has no usage record", r)
			continue
		}
		slices.SortFunc(recs, func(a, b *shizuv1.UsageRecorded) int {
			return a.GetIntervalStart().AsTime().Compare(b.GetIntervalStart().AsTime())
		})
		for i, u := range recs {
			from, to := u.GetIntervalStart().AsTime(), u.GetIntervalEnd().AsTime()
			if span := to.Sub(from); u.GetSeconds() > int64((span+time.Second-1)/time.Second) {
				t.Errorf("%s: record %s bills %d s for %s", r, u.GetMeta().GetEventId(), u.GetSeconds(), span)
			}
			if i > 0 && from.Before(recs[i-1].GetIntervalEnd().AsTime()) {
				t.Errorf("%s billed twice: [%s, %s) on %s overlaps [%s, %s) on %s", r,
					from.Format(time.StampMilli), to.Format(time.StampMilli), u.GetNodeId(),
					recs[i-1].GetIntervalStart().AsTime().Format(time.StampMilli), recs[i-1].GetIntervalEnd().AsTime().Format(time.StampMilli), recs[i-1].GetNodeId())
			}
		}
		from, moved := affected[r]
		if !moved {
			continue
		}
		final := s.rec.latest(r)
		var first *shizuv1.RentalMigrating
		for _, m := range s.rec.migrating[r] {
			if m.GetFromAttempt() == 1 {
				first = m
			}
		}
		if first == nil || s.rec.started[r][1] == nil || final.GetAttempt() < 2 {
			continue // reported by checkMoves
		}
		// The old run is billed up to its last beat; a make-before-break
		// move carries none (the old run is alive): up to the hand-over.
		lastBeat := first.GetLastHeartbeatAt().AsTime()
		if first.GetLastHeartbeatAt() == nil {
			lastBeat = first.GetMeta().GetOccurredAt().AsTime()
		}
		start1, start2 := s.rec.started[r][1].GetStartedAt().AsTime(), final.GetStartedAt().AsTime()
		to := final.GetNodeId()
		var oldBilled int64
		for _, u := range recs {
			a, b := u.GetIntervalStart().AsTime(), u.GetIntervalEnd().AsTime()
			switch u.GetNodeId() {
			case from:
				oldBilled += u.GetSeconds()
				if a.Before(start1) || b.After(lastBeat) {
					t.Errorf("%s: billed [%s, %s) on %s, which ran it from %s to its last beat at %s", r,
						a.Format(time.StampMilli), b.Format(time.StampMilli), from, start1.Format(time.StampMilli), lastBeat.Format(time.StampMilli))
				}
			case to:
				if a.Before(start2) {
					t.Errorf("%s: billed from %s on %s, where it started at %s", r, a.Format(time.StampMilli), to, start2.Format(time.StampMilli))
				}
			default:
				t.Errorf("%s: billed on %s, where it never ran", r, u.GetNodeId())
			}
		}
		if limit := max(0, int64((lastBeat.Sub(start1)+time.Second-1)/time.Second)); oldBilled > limit {
			t.Errorf("%s: %d s billed on %s, which ran it %s until its last beat", r, oldBilled, from, lastBeat.Sub(start1))
		}
	}
}

// runSIGKILL runs the crash scenario: nodes agents, rentals requested
// through the scheduler, kill agents SIGKILLed at once.
func runSIGKILL(t testing.TB, nodes, rentals, kill int) chaosResult {
	s := testStack(t)
	s.startAgents(nodes)
	ids := s.rentAll(rentals)
	s.checkBooks(ids, nil)
	s.waitBilled(ids)

	victims := s.victims(kill)
	affected := s.affected(victims)
	if len(affected) == 0 {
		t.Fatalf("the victims %v hold no rentals", victims)
	}
	killedAt := time.Now()
	s.kill(victims...)
	s.waitMoved(affected, victims)
	var res chaosResult
	s.checkMoves(affected, victims, killedAt, &res)
	for _, n := range victims {
		st, err := s.store.Node(t.Context(), n)
		if err != nil || st.Status != capacity.StatusDead {
			t.Errorf("killed node %s is %v in the store (%v), want dead", n, st.Status, err)
		}
	}
	s.waitOneRunEach(ids)
	s.checkBooks(ids, victims)
	s.waitMeteringCaughtUp(affected)
	s.checkBills(ids, affected)

	// The killed agents come back (the hosts reboot): they find their
	// nodes fenced and register again; what they report of their dead
	// workloads neither restarts a rental, nor frees its new allocation,
	// nor bills anything more.
	for _, n := range victims {
		s.startAgent(n)
	}
	s.eventually(60*time.Second, func() error {
		for _, n := range victims {
			st, err := s.store.Node(t.Context(), n)
			if err != nil {
				return fmt.Errorf("%s not back: %w", n, err)
			}
			if st.Status != capacity.StatusReady {
				return fmt.Errorf("%s not back: %s", n, st.Status)
			}
		}
		return nil
	})
	s.waitOneRunEach(ids)
	s.checkBooks(ids, nil)
	s.rec.mu.Lock()
	for r := range affected {
		if n := len(s.rec.scheduled[r]); n != len(s.rec.migrating[r])+1 {
			t.Errorf("%s placed %d times, moved %d times, after the killed agents came back", r, n, len(s.rec.migrating[r]))
		}
		if ev := s.rec.stopped[r][s.rec.latest(r).GetAttempt()]; ev != nil {
			t.Errorf("%s's new run was stopped (%s)", r, ev.GetExitReason())
		}
	}
	s.rec.mu.Unlock()
	s.waitMeteringCaughtUp(affected)
	s.checkBills(ids, affected)
	return res
}

func TestKilledAgentsRentalsArePlacedAgainAndRunElsewhereBilledWithoutTheDeadInterval(t *testing.T) {
	if testing.Short() {
		t.Skip("starts node-agent child processes and the whole platform")
	}
	t.Parallel()
	res := runSIGKILL(t, 6, 40, 2)
	t.Logf("after SIGKILL of 2 of 6 agents (%d rentals moved, %d of them twice): detection p50 %s p99 %s max %s; handed to the scheduler p50 %s max %s; "+
		"scheduled again (re-placement) p50 %s p99 %s max %s; running again p50 %s p99 %s max %s; downtime p50 %s max %s",
		len(res.running), res.movedTwice,
		percentile(res.detect, .5), percentile(res.detect, .99), percentile(res.detect, 1),
		percentile(res.handedOver, .5), percentile(res.handedOver, 1),
		percentile(res.scheduled, .5), percentile(res.scheduled, .99), percentile(res.scheduled, 1),
		percentile(res.running, .5), percentile(res.running, .99), percentile(res.running, 1),
		percentile(res.downtime, .5), percentile(res.downtime, 1))
}

// A partitioned agent (frozen with SIGSTOP: no beats, its connection open,
// its workloads running on) is found by its heartbeat's TTL, fenced, and
// its rentals run again elsewhere; when it returns (SIGCONT) it finds its
// node fenced, registers again and stops the old runs itself, so no
// rental keeps running twice, and metering bills the old runs only up to
// the last beat although their RentalStopped come much later.
func TestAPartitionedAgentThatReturnsAfterFencingStopsItsOldRunsAndNothingIsBilledTwice(t *testing.T) {
	if testing.Short() {
		t.Skip("starts node-agent child processes and the whole platform")
	}
	t.Parallel()
	res := runSIGSTOP(t, 3, 12, 1)
	t.Logf("partition of 1 of 3 agents (%d rentals): detected %s after SIGSTOP; scheduled again p50 %s max %s; running again p50 %s max %s; downtime p50 %s max %s",
		len(res.running), percentile(res.detect, 1), percentile(res.scheduled, .5), percentile(res.scheduled, 1),
		percentile(res.running, .5), percentile(res.running, 1), percentile(res.downtime, .5), percentile(res.downtime, 1))
}

// runSIGSTOP runs the partition scenario: nodes agents, rentals requested
// through the scheduler, frozen agents stopped with SIGSTOP at once until
// their rentals run elsewhere, then continued.
func runSIGSTOP(t testing.TB, nodes, rentals, frozen int) chaosResult {
	s := testStack(t)
	s.startAgents(nodes)
	ids := s.rentAll(rentals)
	s.waitBilled(ids)
	victims := s.victims(frozen)
	affected := s.affected(victims)
	stoppedAt := time.Now()
	for _, n := range victims {
		if err := s.agents[n].Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	s.waitMoved(affected, victims)
	var res chaosResult
	s.checkMoves(affected, victims, stoppedAt, &res)
	// Partitioned, the old runs still run: the agent cannot know yet.
	for _, n := range victims {
		if err := s.agents[n].Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	s.eventually(60*time.Second, func() error {
		for r, from := range affected {
			st := s.rec.count(func(rec *recorder) int {
				if ev := rec.stopped[r][1]; ev != nil && ev.GetNodeId() == from {
					return 1
				}
				return 0
			})
			if st == 0 {
				return fmt.Errorf("the old run of %s on %s not stopped yet", r, from)
			}
		}
		return nil
	})
	s.rec.mu.Lock()
	for r := range affected {
		if ev := s.rec.stopped[r][1]; ev.GetExitReason() != shizuv1.ExitReason_EXIT_REASON_NODE_FAILED {
			t.Errorf("%s's old run stopped for %s, want NODE_FAILED", r, ev.GetExitReason())
		}
		if ev := s.rec.stopped[r][s.rec.latest(r).GetAttempt()]; ev != nil {
			t.Errorf("%s's new run was stopped (%s)", r, ev.GetExitReason())
		}
	}
	s.rec.mu.Unlock()
	s.waitOneRunEach(ids)
	// The returned nodes registered again (a new epoch) and hold nothing of
	// what they lost.
	s.eventually(30*time.Second, func() error {
		for _, n := range victims {
			st, err := s.store.Node(t.Context(), n)
			if err != nil {
				return fmt.Errorf("%s not back: %w", n, err)
			}
			if st.Status != capacity.StatusReady {
				return fmt.Errorf("%s not back: %s", n, st.Status)
			}
		}
		return nil
	})
	s.checkBooks(ids, nil)
	s.waitMeteringCaughtUp(affected)
	s.checkBills(ids, affected)
	return res
}

// A spot interruption notice, with room elsewhere, moves every rental of
// the node make-before-break: the replacement is placed next to the old
// run (the capacity store holds both allocations, each on its own node)
// and started, and only then is the old run stopped, well before the
// deadline; nothing runs twice afterwards, no capacity is leaked, and the
// overlap is billed once: the old run up to the hand-over, the new one
// from its start (docs/failover.md).
func TestASpotNoticeStartsEachReplacementBeforeTheOldRunStops(t *testing.T) {
	if testing.Short() {
		t.Skip("starts node-agent child processes and the whole platform")
	}
	t.Parallel()
	s := testStack(t)
	s.startAgents(4)
	ids := s.rentAll(16)
	s.waitBilled(ids)
	spot := s.victims(1)
	affected := s.affected(spot)
	noticedAt := time.Now()
	s.notice(spot[0])
	deadline := noticedAt.Add(noticeLead)
	// Every affected rental runs attempt 2 elsewhere and its old run was
	// stopped for the move.
	s.eventually(60*time.Second, func() error {
		s.rec.mu.Lock()
		defer s.rec.mu.Unlock()
		for r := range affected {
			if s.rec.started[r][2] == nil || s.rec.stopped[r][1] == nil || len(s.rec.migrated[r]) == 0 {
				return fmt.Errorf("%s: started %d, stopped %d, migrated %d", r, len(s.rec.started[r]), len(s.rec.stopped[r]), len(s.rec.migrated[r]))
			}
		}
		return nil
	})
	s.rec.mu.Lock()
	for r := range affected {
		ms := s.rec.migrating[r]
		if len(ms) != 1 || ms[0].GetReason() != shizuv1.MigrationReason_MIGRATION_REASON_SPOT_INTERRUPTION ||
			ms[0].GetFromNodeId() != spot[0] || ms[0].GetFromAttempt() != 1 || ms[0].GetNextAttempt() != 2 || ms[0].GetLastHeartbeatAt() != nil {
			t.Errorf("%s: moves %v, want one spot hand-over from %s, attempt 1 -> 2, without a last beat", r, ms, spot[0])
			continue
		}
		started, stopped := s.rec.started[r][2], s.rec.stopped[r][1]
		if started.GetNodeId() == spot[0] {
			t.Errorf("%s: replacement started on the reclaimed node", r)
		}
		// Make before break: the replacement ran before the old run ended,
		// which ended before the deadline, for the move.
		if !started.GetStartedAt().AsTime().Before(stopped.GetStoppedAt().AsTime()) {
			t.Errorf("%s: replacement started at %s, the old run stopped at %s: a break", r,
				started.GetStartedAt().AsTime().Format(time.StampMilli), stopped.GetStoppedAt().AsTime().Format(time.StampMilli))
		}
		if !stopped.GetStoppedAt().AsTime().Before(deadline) || stopped.GetExitReason() != shizuv1.ExitReason_EXIT_REASON_MIGRATED {
			t.Errorf("%s: old run stopped at %s (%s), deadline %s", r, stopped.GetStoppedAt().AsTime().Format(time.StampMilli),
				stopped.GetExitReason(), deadline.Format(time.StampMilli))
		}
		mg := s.rec.migrated[r][0]
		if len(s.rec.migrated[r]) != 1 || mg.GetDowntime().AsDuration() != 0 || mg.GetToNodeId() != started.GetNodeId() {
			t.Errorf("%s: migrated %v, want once to %s with no downtime", r, s.rec.migrated[r], started.GetNodeId())
		}
		if s.rec.scheduled[r][3] != nil {
			t.Errorf("%s placed a third time", r)
		}
	}
	for r := range s.rec.migrating {
		if _, ok := affected[r]; !ok {
			t.Errorf("%s moved, but its node got no notice", r)
		}
	}
	if len(s.rec.lost) != 0 {
		t.Errorf("nodes lost before the deadline: %v", s.rec.lost)
	}
	s.rec.mu.Unlock()
	// The old runs' allocations were released when they stopped: the
	// reclaimed node holds nothing, and each rental exactly one allocation.
	s.eventually(30*time.Second, func() error {
		allocs, err := s.store.Allocations(t.Context(), spot[0])
		if err != nil {
			return fmt.Errorf("%s's allocations: %w", spot[0], err)
		}
		if len(allocs) != 0 {
			return fmt.Errorf("%s still holds %d allocations", spot[0], len(allocs))
		}
		return nil
	})
	st, err := s.store.Node(t.Context(), spot[0])
	if err != nil || st.Status != capacity.StatusDraining {
		t.Errorf("the reclaimed node is %s (%v), want draining until its deadline", st.Status, err)
	}
	s.waitOneRunEach(ids)
	s.checkBooks(ids, nil)
	s.waitMeteringCaughtUp(affected)
	s.checkBills(ids, affected)
	var overlap []time.Duration
	s.rec.mu.Lock()
	for r := range affected {
		overlap = append(overlap, s.rec.stopped[r][1].GetStoppedAt().AsTime().Sub(s.rec.started[r][2].GetStartedAt().AsTime()))
	}
	s.rec.mu.Unlock()
	t.Logf("spot notice on %s (%d rentals): replacement running before the old run stopped by p50 %s, min %s",
		spot[0], len(affected), percentile(overlap, .5), percentile(overlap, 0))
}

// A node killed less than a heartbeat interval after a rental started on
// it has its last beat before the rental's start. Metering must bill that
// run nothing (its segment ends at the last beat, clamped to its start),
// not leave the segment open with no stop ever coming.
//
// The race is built, not waited for: the node that is killed beats every
// two minutes, so its one beat (when it registered) comes before every
// rental it starts, and it is killed well within that. Its rentals are
// placed while it is the only node; the nodes they move to start after.
func TestARentalWhoseNodeDiesBeforeItsNextBeatIsBilledNothingOnIt(t *testing.T) {
	if testing.Short() {
		t.Skip("starts node-agent child processes and the whole platform")
	}
	t.Parallel()
	s := testStack(t)
	const victim = "n00"
	s.startAgentBeating(victim, 2*time.Minute)
	s.waitNodesReady()
	ids := s.rentAll(6) // at most 7 GPUs: they fit on the one node
	s.startAgent("n01")
	s.startAgent("n02")
	s.waitNodesReady()
	victims := []string{victim}
	affected := s.affected(victims)
	if len(affected) != len(ids) {
		t.Fatalf("%d of %d rentals on %s, the only node they could be placed on", len(affected), len(ids), victim)
	}
	killedAt := time.Now()
	s.kill(victims...)
	s.waitMoved(affected, victims)
	s.checkMoves(affected, victims, killedAt, nil)
	s.rec.mu.Lock()
	for r := range affected {
		beat, start := s.rec.migrating[r][0].GetLastHeartbeatAt().AsTime(), s.rec.started[r][1].GetStartedAt().AsTime()
		if !beat.Before(start) {
			t.Errorf("%s started on %s at %s, not after its last beat at %s: the race was not built", r, victim,
				start.Format(time.StampMilli), beat.Format(time.StampMilli))
		}
	}
	s.rec.mu.Unlock()
	s.waitOneRunEach(ids)
	s.checkBooks(ids, victims)
	s.waitMeteringCaughtUp(affected)
	s.checkBills(ids, affected)
}

// BenchmarkChaosSIGKILL is the scenario: 20 nodes, 200 rentals
// placed by the scheduler, 4 agents SIGKILLed at once, default 1 s
// heartbeat / 3 s TTL, failover's disconnect fast path on. b.N is ignored
// (one round a run); it reports, from the kill, detection (NodeLost),
// hand-over (RentalMigrating), re-placement (RentalScheduled of attempt
// 2), running again (its started_at) and per-rental downtime, p50/p99/max
// in seconds.
//
// The scheduled_p99_of_goal metric is the re-placement p99 over the
// issue's goal (2 s): at most 1 meets it.
//
//	cd cmd/shizu && go test -run '^$' -bench ChaosSIGKILL -benchtime=1x ./e2e/
func BenchmarkChaosSIGKILL(b *testing.B) {
	for b.Loop() {
		reportChaos(b, runSIGKILL(b, 20, 200, 4), 2*time.Second)
	}
}

// BenchmarkChaosSIGSTOP is the silent partition: 20 nodes, 200 rentals, 4
// agents frozen with SIGSTOP at once (their connections stay open, so only
// the heartbeat TTL finds them), continued once their rentals run
// elsewhere. Same metrics as BenchmarkChaosSIGKILL; the goal is 5 s.
//
//	cd cmd/shizu && go test -run '^$' -bench ChaosSIGSTOP -benchtime=1x ./e2e/
func BenchmarkChaosSIGSTOP(b *testing.B) {
	for b.Loop() {
		reportChaos(b, runSIGSTOP(b, 20, 200, 4), 5*time.Second)
	}
}

func reportChaos(b *testing.B, res chaosResult, goal time.Duration) {
	b.ReportMetric(float64(len(res.running)), "rentals_moved")
	b.ReportMetric(float64(res.movedTwice), "rentals_moved_twice")
	for _, m := range []struct {
		name string
		ds   []time.Duration
	}{{"detect", res.detect}, {"handed_over", res.handedOver}, {"scheduled", res.scheduled}, {"running", res.running}, {"downtime", res.downtime}} {
		for _, p := range []float64{.5, .99, 1} {
			name := "p" + strconv.Itoa(int(p*100))
			if p == 1 {
				name = "max"
			}
			b.ReportMetric(percentile(m.ds, p).Seconds(), m.name+"_"+name+"_s")
		}
	}
	b.ReportMetric(percentile(res.scheduled, .99).Seconds()/goal.Seconds(), "scheduled_p99_of_goal")
}
