package e2e

import (
	"fmt"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// Redis restarted without its data (as compose and k8s once ran it, with
// no AOF) is a rebuild, not a loss (issue 14): the node agents restore
// their nodes with their workloads' allocations, the scheduler rebuilds
// its records from the rentals stream, so no running rental is stopped,
// each still runs exactly once, the store's books match the runs again,
// and every request that waited for capacity is placed, once, when
// capacity comes.
func TestLosingRedisStopsNoRentalAndOrphansNoRequest(t *testing.T) {
	if testing.Short() {
		t.Skip("starts node-agent child processes and the whole platform")
	}
	t.Parallel()
	s := testStack(t)
	s.startAgents(3)
	ids := s.rentAll(40)
	s.checkBooks(ids, nil)
	var waiting []string
	for i := range 3 {
		id := fmt.Sprintf("e2e-wait%d", i)
		waiting = append(waiting, id)
		// A whole node: none of the three partly used ones can take it.
		s.request(id, &shizuv1.RentalSpec{Plan: shizuv1.Plan_PLAN_ON_DEMAND, GpuCount: 8, MilliGpu: 1000})
	}
	s.eventually(60*time.Second, func() error {
		for _, id := range waiting {
			if s.rec.count(func(r *recorder) int {
				if r.pending[id] == nil {
					return 0
				}
				return 1
			}) == 0 {
				return fmt.Errorf("%s not pending yet", id)
			}
		}
		return nil
	})

	lostAt := time.Now()
	s.redis.Restart(t)

	s.eventually(60*time.Second, func() error {
		snap, err := s.store.Snapshot(t.Context())
		if err != nil {
			return err
		}
		held := 0
		for _, n := range snap.Nodes {
			held += len(n.Allocations)
		}
		if len(snap.Nodes) != 3 || held != len(ids) {
			return fmt.Errorf("%d nodes holding %d allocations restored, want 3 holding %d", len(snap.Nodes), held, len(ids))
		}
		return nil
	})
	restored := time.Since(lostAt)
	s.checkBooks(ids, nil)
	s.waitOneRunEach(ids)

	for i := 3; i < 6; i++ {
		s.startAgent(fmt.Sprintf("n%02d", i))
	}
	s.waitNodesReady()
	s.eventually(60*time.Second, func() error {
		for _, id := range waiting {
			if s.rec.startedAt(id, 1) == nil {
				return fmt.Errorf("%s not running yet", id)
			}
		}
		return nil
	})
	placed := time.Since(lostAt)

	s.rec.mu.Lock()
	defer s.rec.mu.Unlock()
	stopped, orphaned := 0, 0
	for _, id := range ids {
		if len(s.rec.stopped[id]) > 0 || len(s.rec.scheduled[id]) != 1 {
			stopped++
			t.Errorf("%s: stopped %v, scheduled %d times; want running, placed once", id, s.rec.stopped[id], len(s.rec.scheduled[id]))
		}
	}
	for _, id := range waiting {
		if len(s.rec.scheduled[id]) != 1 || s.rec.rejected[id] != nil {
			orphaned++
			t.Errorf("%s: scheduled %d times, rejected %v; want placed once", id, len(s.rec.scheduled[id]), s.rec.rejected[id])
		}
	}
	t.Logf("after losing Redis with %d rentals running and %d waiting: %d stopped, %d orphaned; nodes restored %s after the loss, "+
		"the waiting requests running %s after it (3 more nodes started meanwhile)",
		len(ids), len(waiting), stopped, orphaned, restored.Round(time.Millisecond), placed.Round(time.Millisecond))
}
