package redisstore

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// pipeliner sends the scripts many handlers run at once to Redis in shared
// pipelines: while one pipeline is on the wire, the calls that arrive queue
// up and leave together in the next, so a burst of N events costs a few
// round trips instead of N. Each call is still one atomic script.
type pipeliner struct {
	rdb    redis.UniversalClient
	calls  chan *call
	lanes  int32
	active atomic.Int32
}

type call struct {
	ctx    context.Context
	script *redis.Script
	keys   []string
	args   []any
	res    any
	err    error
	done   chan struct{}
}

// maxBatch bounds one pipeline.
const maxBatch = 512

// newPipeliner allows up to lanes pipelines on the wire at once. Lanes
// start when calls queue and end when the queue is empty, so an idle store
// holds no goroutines.
func newPipeliner(rdb redis.UniversalClient, lanes int) *pipeliner {
	return &pipeliner{rdb: rdb, calls: make(chan *call, 4*maxBatch), lanes: int32(lanes)}
}

// run executes script in the next pipeline and waits for its result.
func (p *pipeliner) run(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error) {
	c := &call{ctx: ctx, script: script, keys: keys, args: args, done: make(chan struct{})}
	select {
	case p.calls <- c:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	p.kick()
	select {
	case <-c.done:
		return c.res, c.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// kick starts a lane unless all are running.
func (p *pipeliner) kick() {
	for {
		n := p.active.Load()
		if n >= p.lanes {
			return
		}
		if p.active.CompareAndSwap(n, n+1) {
			go p.lane()
			return
		}
	}
}

func (p *pipeliner) lane() {
	batch := make([]*call, 0, maxBatch)
	for {
		batch = batch[:0]
	fill:
		for len(batch) < maxBatch {
			select {
			case c := <-p.calls:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		if len(batch) == 0 {
			p.active.Add(-1)
			// A call queued after the queue looked empty but before this
			// lane counted itself out would wait for nobody: kick again.
			if len(p.calls) > 0 {
				p.kick()
			}
			return
		}
		p.exec(batch)
	}
}

// exec runs a batch in one pipeline, under the first caller's context
// without its cancellation: a caller that gives up must not fail the
// others' calls (it stops waiting; its call still runs).
func (p *pipeliner) exec(batch []*call) {
	ctx := context.WithoutCancel(batch[0].ctx)
	pipe := p.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(batch))
	for i, c := range batch {
		cmds[i] = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx)
	for i, c := range batch {
		c.res, c.err = cmds[i].Result()
		if c.err != nil && strings.HasPrefix(c.err.Error(), "NOSCRIPT") {
			// Redis lost its script cache (a restart): load and run it.
			c.res, c.err = c.script.Run(context.WithoutCancel(c.ctx), p.rdb, c.keys, c.args...).Result()
		}
		if errors.Is(c.err, redis.Nil) {
			c.res, c.err = nil, nil
		}
		close(c.done)
	}
}
