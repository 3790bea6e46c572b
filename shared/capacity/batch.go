package capacity

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// ReserveResult is what Reserve would have returned for one placement of
// ReserveMany.
type ReserveResult struct {
	Allocation Allocation
	Err        error
}

// ReserveMany commits many placements in one round trip: one pipeline of
// the reserve script, one call per placement, in order. Each placement is
// committed exactly as Reserve commits it, in its own atomic step with the
// same checks, idempotence and errors; nothing is atomic across
// placements. Two placements of one batch that want the same capacity are
// decided in order: the first takes it, the second gets an
// *InsufficientError (or the first's allocation with Existing set when
// both name the same rental).
//
// The i-th result belongs to ps[i]. A placement that fails validation gets
// ErrInvalid and is not sent. When Redis fails, the placements whose
// replies were lost get ErrUnavailable: they may or may not have been
// applied, and retrying them (with Reserve or ReserveMany) is safe.
func (s *Store) ReserveMany(ctx context.Context, ps []Placement) []ReserveResult {
	out := make([]ReserveResult, len(ps))
	calls := make([]reserveCall, len(ps))
	todo := make([]int, 0, len(ps))
	for i, p := range ps {
		c, err := s.reserveCall(p)
		if err != nil {
			out[i].Err = err
			continue
		}
		calls[i] = c
		todo = append(todo, i)
	}
	// A NOSCRIPT reply means the script did not run (Redis lost its script
	// cache): load it and send those placements once more.
	for attempt := 0; len(todo) > 0; attempt++ {
		pipe := s.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(todo))
		for k, i := range todo {
			cmds[k] = reserveScript.EvalSha(ctx, pipe, calls[i].keys, calls[i].args...)
		}
		_, _ = pipe.Exec(ctx) // each command carries its own error
		var again []int
		for k, i := range todo {
			res, err := cmds[k].Slice()
			switch {
			case err == nil:
				out[i].Allocation, out[i].Err = calls[i].outcome(res)
			case redis.HasErrorPrefix(err, "NOSCRIPT") && attempt == 0:
				again = append(again, i)
			default:
				out[i].Err = unavailable(calls[i].op, err)
			}
		}
		if len(again) > 0 {
			if err := reserveScript.Load(ctx, s.rdb).Err(); err != nil {
				for _, i := range again {
					out[i].Err = unavailable(calls[i].op, err)
				}
				again = nil
			}
		}
		todo = again
	}
	return out
}
