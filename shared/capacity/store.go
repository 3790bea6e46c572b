package capacity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"
	"unicode"

	"github.com/redis/go-redis/v9"
)

// DefaultPrefix starts every key of a store made without WithPrefix.
const DefaultPrefix = "shizu"

// DefaultSnapshotBatch is how many nodes one Snapshot round trip reads.
const DefaultSnapshotBatch = 250

// Store is the live-capacity store. It is safe for concurrent use; any
// number of Stores (scheduler, failover and agent replicas) may share one
// Redis and prefix.
type Store struct {
	rdb   redis.UniversalClient
	keys  keyspace
	now   func() time.Time
	batch int

	mu    sync.Mutex
	cache *decodeCache // what the last Snapshot decoded
}

type config struct {
	prefix string
	now    func() time.Time
	batch  int
}

// Option configures New.
type Option func(*config)

// WithPrefix sets the prefix of every key (default DefaultPrefix). Stores
// with different prefixes on one Redis do not see each other. A prefix that
// is a hash tag, such as "{shizu}", puts every key in one Redis Cluster slot.
func WithPrefix(prefix string) Option { return func(c *config) { c.prefix = prefix } }

// New returns a Store on rdb.
func New(rdb redis.UniversalClient, opts ...Option) (*Store, error) {
	c := config{prefix: DefaultPrefix, now: time.Now, batch: DefaultSnapshotBatch}
	for _, o := range opts {
		o(&c)
	}
	var errs []error
	if rdb == nil {
		errs = append(errs, errors.New("redis client: must not be nil"))
	}
	if c.prefix == "" || len(c.prefix) > MaxIDLen {
		errs = append(errs, fmt.Errorf("prefix: must be 1..%d characters, got %q", MaxIDLen, c.prefix))
	}
	for _, r := range c.prefix {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			errs = append(errs, fmt.Errorf("prefix: %q contains a space or control character", c.prefix))
			break
		}
	}
	if c.now == nil {
		errs = append(errs, errors.New("clock: must not be nil"))
	}
	if c.batch < 1 || c.batch > 10000 {
		errs = append(errs, fmt.Errorf("snapshot batch: must be in 1..10000, got %d", c.batch))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("capacity: new store: %w", invalid(errs...))
	}
	return &Store{rdb: rdb, keys: keyspace{prefix: c.prefix}, now: c.now, batch: c.batch}, nil
}

// keyspace names the store's keys; see the package documentation.
type keyspace struct{ prefix string }

func (k keyspace) node(id string) string   { return k.prefix + ":node:{" + id + "}" }
func (k keyspace) allocs(id string) string { return k.prefix + ":node:{" + id + "}:allocs" }
func (k keyspace) nodes() string           { return k.prefix + ":nodes" }
func (k keyspace) rentals() string         { return k.prefix + ":rentals" }
func (k keyspace) version() string         { return k.prefix + ":version" }
func (k keyspace) generation() string      { return k.prefix + ":generation" }
func (k keyspace) usage() string           { return k.prefix + ":usage" }

// unavailable wraps an error from Redis itself.
func unavailable(op string, err error) error {
	return fmt.Errorf("capacity: %s: %w: %w", op, ErrUnavailable, err)
}

// run runs a script and returns its reply as a list.
func (s *Store) run(ctx context.Context, op string, sc *redis.Script, keys []string, args ...any) ([]any, error) {
	res, err := sc.Run(ctx, s.rdb, keys, args...).Slice()
	if err != nil {
		return nil, unavailable(op, err)
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("capacity: %s: empty script reply", op)
	}
	return res, nil
}

func checkNodeID(op, id string) error {
	var p problems
	p.id("nodeID", id)
	if err := invalid(p...); err != nil {
		return fmt.Errorf("capacity: %s: %w", op, err)
	}
	return nil
}

func checkEpoch(p *problems, field string, epoch uint64) {
	if epoch == 0 {
		p.addf(field, "must be >= 1, got 0")
	}
}

// Reserve commits a placement in one atomic step: the node must exist, be
// ready and still be at p.Epoch; the host must have p's CPU and memory free;
// and every GPU of p must have the milli-GPU, the VRAM and a sharer slot.
// Either all of it is taken or nothing is.
//
// Reserve is idempotent per rental id: if the rental is already recorded,
// on this node or any other, the recorded allocation is returned with
// Existing set, whatever p asks for, and nothing is written.
//
// A MIG share takes the instance it names, which must exist on a GPU in
// MIG mode and be free (else *InsufficientError for ResourceMIGInstance);
// a GPU in MIG mode takes no other share.
//
// Errors: ErrInvalid (p fails Validate, or the node lacks a GPU of p),
// ErrNotFound (no such node), ErrFenced (node dead, or its epoch is not
// p.Epoch: it was fenced since the scheduler looked), ErrConflict (node
// draining, a GPU of p is not healthy (see SetGPUHealth), a MIG share on a
// GPU not in MIG mode or naming an instance it does not have, a non-MIG
// share on a GPU in MIG mode: the caller's view is stale),
// *InsufficientError, *QuotaError (p.Quota is set and the placement would
// take its tenant past it; checked before the node's capacity).
//
// Every reserve adds the placement to its tenant's usage (quota.go),
// whether or not p.Quota is set.
func (s *Store) Reserve(ctx context.Context, p Placement) (Allocation, error) {
	c, err := s.reserveCall(p)
	if err != nil {
		return Allocation{}, err
	}
	res, err := s.run(ctx, c.op, reserveScript, c.keys, c.args...)
	if err != nil {
		return Allocation{}, err
	}
	return c.outcome(res)
}

// reserveCall is one reserve script call, ready to run: Reserve runs one,
// ReserveMany pipelines many.
type reserveCall struct {
	op      string
	p       Placement
	created time.Time
	keys    []string
	args    []any
}

// reserveCall validates p and builds its script call.
func (s *Store) reserveCall(p Placement) (reserveCall, error) {
	op := fmt.Sprintf("reserve rental %s on node %s", p.RentalID, p.NodeID)
	if err := p.Validate(); err != nil {
		return reserveCall{}, fmt.Errorf("capacity: %s: %w", op, err)
	}
	created := s.now().UTC()
	raw, err := encodeAllocation(p, created)
	if err != nil {
		return reserveCall{}, fmt.Errorf("capacity: %s: %w", op, err)
	}
	args := make([]any, 0, 10+5*len(p.GPUs))
	args = append(args, p.RentalID, p.Epoch, p.CPUMilli, p.MemoryMiB, raw, len(p.GPUs))
	for _, g := range p.GPUs {
		args = append(args, g.Index, g.Milli, g.VRAMMiB, g.MIGProfile, g.MIGInstance)
	}
	args = append(args, quotaArgs(p.Tenant, p.Quota)...)
	return reserveCall{op: op, p: p, created: created, args: args,
		keys: []string{s.keys.node(p.NodeID), s.keys.allocs(p.NodeID), s.keys.rentals(), s.keys.version(), s.keys.usage()}}, nil
}

// outcome maps the reserve script's reply to Reserve's result.
func (c reserveCall) outcome(res []any) (Allocation, error) {
	op, p := c.op, c.p
	if len(res) == 0 {
		return Allocation{}, fmt.Errorf("capacity: %s: empty script reply", op)
	}
	switch str(res[0]) {
	case "ok":
		p.GPUs = slices.Clone(p.GPUs)
		p.Quota = nil
		return Allocation{Placement: p, CreatedAt: c.created}, nil
	case "quota":
		return Allocation{}, quotaOutcome(op, p, res)
	case "existing":
		a, err := decodeAllocation(str(res[1]))
		if err != nil {
			return Allocation{}, fmt.Errorf("capacity: %s: %w", op, err)
		}
		a.Existing = true
		return a, nil
	case "not_found":
		return Allocation{}, fmt.Errorf("capacity: %s: %w: no such node", op, ErrNotFound)
	case "dead":
		return Allocation{}, fmt.Errorf("capacity: %s: %w: node is dead at epoch %s", op, ErrFenced, str(res[1]))
	case "epoch":
		return Allocation{}, fmt.Errorf("capacity: %s: %w: node is at epoch %s, placement saw %d", op, ErrFenced, str(res[1]), p.Epoch)
	case "not_ready":
		return Allocation{}, fmt.Errorf("capacity: %s: %w: node is %s", op, ErrConflict, str(res[1]))
	case "short":
		gpu, _ := strconv.Atoi(str(res[1]))
		return Allocation{}, fmt.Errorf("capacity: %s: %w", op, &InsufficientError{
			Node: p.NodeID, GPU: gpu, Resource: str(res[2]), Free: num(res[3]), Want: num(res[4]),
		})
	case "no_gpu":
		return Allocation{}, fmt.Errorf("capacity: %s: %w: node has %s GPUs, placement names GPU %s", op, ErrInvalid, str(res[2]), str(res[1]))
	case "not_mig":
		return Allocation{}, fmt.Errorf("capacity: %s: %w: GPU %s is not in MIG mode", op, ErrConflict, str(res[1]))
	case "mig_mode":
		return Allocation{}, fmt.Errorf("capacity: %s: %w: GPU %s is in MIG mode and takes only MIG shares", op, ErrConflict, str(res[1]))
	case "no_instance":
		return Allocation{}, fmt.Errorf("capacity: %s: %w: GPU %s has no MIG instance %s", op, ErrConflict, str(res[1]), str(res[2]))
	case "wrong_profile":
		return Allocation{}, fmt.Errorf("capacity: %s: %w: GPU %s's MIG instance %s is a %s, not the share's profile", op, ErrConflict, str(res[1]), str(res[2]), str(res[3]))
	case "unhealthy":
		return Allocation{}, fmt.Errorf("capacity: %s: %w: GPU %s is %s", op, ErrConflict, str(res[1]), str(res[2]))
	case "handing_over":
		return Allocation{}, fmt.Errorf("capacity: %s: %w: the node still holds the rental's previous run", op, ErrConflict)
	}
	return Allocation{}, unexpected(op, res)
}

// maxReleaseHops bounds how often Release follows a rental that moved
// between its index read and its script (released and reserved elsewhere).
const maxReleaseHops = 16

// Release gives a rental's capacity back exactly as it was taken and forgets
// the allocation. It is idempotent: released is false, with no error, when
// the rental is not recorded.
func (s *Store) Release(ctx context.Context, rentalID string) (released bool, err error) {
	op := "release rental " + rentalID
	var p problems
	p.id("rentalID", rentalID)
	if err := invalid(p...); err != nil {
		return false, fmt.Errorf("capacity: %s: %w", op, err)
	}
	for range maxReleaseHops {
		raw, err := s.rdb.HGet(ctx, s.keys.rentals(), rentalID).Result()
		if errors.Is(err, redis.Nil) {
			return false, nil
		}
		if err != nil {
			return false, unavailable(op, err)
		}
		a, err := decodeAllocation(raw)
		if err != nil {
			return false, fmt.Errorf("capacity: %s: %w", op, err)
		}
		res, err := s.run(ctx, op, releaseScript,
			[]string{s.keys.node(a.NodeID), s.keys.allocs(a.NodeID), s.keys.rentals(), s.keys.version(), s.keys.usage()},
			rentalID, a.NodeID, "live")
		if err != nil {
			return false, err
		}
		switch str(res[0]) {
		case "ok":
			return true, nil
		case "none":
			return false, nil
		case "moved":
			continue
		default:
			return false, unexpected(op, res)
		}
	}
	return false, fmt.Errorf("capacity: %s: %w: the rental moved between nodes %d times while being released", op, ErrConflict, maxReleaseHops)
}

// Renew is the node agent's check that it still holds a rental under its
// epoch. It changes nothing. Errors: ErrFenced when the node is dead, is no
// longer at epoch, or recorded the allocation under an older epoch (a
// fenced node's allocations can never be renewed); ErrNotFound when the
// node or the allocation on that node is gone.
func (s *Store) Renew(ctx context.Context, rentalID, nodeID string, epoch uint64) error {
	op := fmt.Sprintf("renew rental %s on node %s", rentalID, nodeID)
	var p problems
	p.id("rentalID", rentalID)
	p.id("nodeID", nodeID)
	checkEpoch(&p, "epoch", epoch)
	if err := invalid(p...); err != nil {
		return fmt.Errorf("capacity: %s: %w", op, err)
	}
	res, err := s.run(ctx, op, renewScript, []string{s.keys.node(nodeID), s.keys.allocs(nodeID)}, rentalID, epoch)
	if err != nil {
		return err
	}
	switch str(res[0]) {
	case "ok":
		return nil
	case "no_node":
		return fmt.Errorf("capacity: %s: %w: no such node", op, ErrNotFound)
	case "no_alloc":
		return fmt.Errorf("capacity: %s: %w: the node holds no such allocation", op, ErrNotFound)
	case "dead":
		return fmt.Errorf("capacity: %s: %w: node is dead at epoch %s", op, ErrFenced, str(res[1]))
	case "epoch":
		return fmt.Errorf("capacity: %s: %w: node is at epoch %s, agent holds %d", op, ErrFenced, str(res[1]), epoch)
	case "stale":
		return fmt.Errorf("capacity: %s: %w: allocation was made at epoch %s, node is at %s", op, ErrFenced, str(res[1]), str(res[2]))
	}
	return unexpected(op, res)
}

// Fence takes a node out of service in one atomic step, if its epoch is
// still expectedEpoch: the epoch moves on by one, the node becomes dead and
// the allocations it held are returned, so the caller can move them. They
// stay recorded (and keep their capacity) until Released; Allocations reads
// them again. With several callers at the same epoch exactly one wins; the
// others get ErrConflict. ErrNotFound when there is no such node.
func (s *Store) Fence(ctx context.Context, nodeID string, expectedEpoch uint64) (FenceResult, error) {
	op := fmt.Sprintf("fence node %s at epoch %d", nodeID, expectedEpoch)
	var p problems
	p.id("nodeID", nodeID)
	checkEpoch(&p, "expectedEpoch", expectedEpoch)
	if err := invalid(p...); err != nil {
		return FenceResult{}, fmt.Errorf("capacity: %s: %w", op, err)
	}
	res, err := s.run(ctx, op, fenceScript,
		[]string{s.keys.node(nodeID), s.keys.allocs(nodeID), s.keys.version()}, expectedEpoch)
	if err != nil {
		return FenceResult{}, err
	}
	switch str(res[0]) {
	case "ok":
		raws, _ := res[2].([]any)
		allocs, err := decodeAllocations(raws)
		if err != nil {
			return FenceResult{}, fmt.Errorf("capacity: %s: %w", op, err)
		}
		return FenceResult{Epoch: uint64(num(res[1])), Allocations: allocs}, nil
	case "not_found":
		return FenceResult{}, fmt.Errorf("capacity: %s: %w: no such node", op, ErrNotFound)
	case "conflict":
		return FenceResult{}, fmt.Errorf("capacity: %s: %w: node is at epoch %s", op, ErrConflict, str(res[1]))
	}
	return FenceResult{}, unexpected(op, res)
}

// SetStatus switches a live node between StatusReady and StatusDraining, if
// its epoch is still expectedEpoch (else ErrConflict). A dead node cannot be
// changed (ErrFenced): only Register brings it back, and only Fence kills
// one. Setting the status a node already has changes nothing.
func (s *Store) SetStatus(ctx context.Context, nodeID string, status NodeStatus, expectedEpoch uint64) error {
	op := fmt.Sprintf("set node %s %s", nodeID, status)
	var p problems
	p.id("nodeID", nodeID)
	if status != StatusReady && status != StatusDraining {
		p.addf("status", "must be %q or %q (use Fence to kill a node), got %q", StatusReady, StatusDraining, status)
	}
	checkEpoch(&p, "expectedEpoch", expectedEpoch)
	if err := invalid(p...); err != nil {
		return fmt.Errorf("capacity: %s: %w", op, err)
	}
	res, err := s.run(ctx, op, setStatusScript, []string{s.keys.node(nodeID), s.keys.version()}, string(status), expectedEpoch)
	if err != nil {
		return err
	}
	switch str(res[0]) {
	case "ok":
		return nil
	case "not_found":
		return fmt.Errorf("capacity: %s: %w: no such node", op, ErrNotFound)
	case "dead":
		return fmt.Errorf("capacity: %s: %w: node is dead at epoch %s; it comes back by registering", op, ErrFenced, str(res[1]))
	case "conflict":
		return fmt.Errorf("capacity: %s: %w: node is at epoch %s, caller expected %d", op, ErrConflict, str(res[1]), expectedEpoch)
	}
	return unexpected(op, res)
}

// Remove forgets a node. It fails with ErrConflict while the node holds
// allocations (release or move them first) and ErrNotFound when there is no
// such node. A node registered again after Remove starts over at epoch 1.
func (s *Store) Remove(ctx context.Context, nodeID string) error {
	op := "remove node " + nodeID
	if err := checkNodeID(op, nodeID); err != nil {
		return err
	}
	res, err := s.run(ctx, op, removeScript,
		[]string{s.keys.node(nodeID), s.keys.allocs(nodeID), s.keys.nodes(), s.keys.version()}, nodeID)
	if err != nil {
		return err
	}
	switch str(res[0]) {
	case "ok":
		return nil
	case "not_found":
		return fmt.Errorf("capacity: %s: %w: no such node", op, ErrNotFound)
	case "busy":
		return fmt.Errorf("capacity: %s: %w: node still holds %d allocations", op, ErrConflict, num(res[1]))
	}
	return unexpected(op, res)
}

// Node reads one node, atomically.
func (s *Store) Node(ctx context.Context, nodeID string) (NodeState, error) {
	op := "read node " + nodeID
	if err := checkNodeID(op, nodeID); err != nil {
		return NodeState{}, err
	}
	states, err := s.readNodes(ctx, op, nil, []string{nodeID})
	if err != nil {
		return NodeState{}, err
	}
	if len(states) == 0 {
		return NodeState{}, fmt.Errorf("capacity: %s: %w: no such node", op, ErrNotFound)
	}
	return states[0], nil
}

// Allocations returns the allocations a node holds (including, after a
// Fence, those recorded under its old epoch), sorted by rental id.
func (s *Store) Allocations(ctx context.Context, nodeID string) ([]Allocation, error) {
	st, err := s.Node(ctx, nodeID)
	if err != nil {
		return nil, err
	}
	return st.Allocations, nil
}

// Allocation returns one rental's allocation, on whichever node it is.
func (s *Store) Allocation(ctx context.Context, rentalID string) (Allocation, error) {
	op := "read rental " + rentalID
	var p problems
	p.id("rentalID", rentalID)
	if err := invalid(p...); err != nil {
		return Allocation{}, fmt.Errorf("capacity: %s: %w", op, err)
	}
	raw, err := s.rdb.HGet(ctx, s.keys.rentals(), rentalID).Result()
	if errors.Is(err, redis.Nil) {
		return Allocation{}, fmt.Errorf("capacity: %s: %w", op, ErrNotFound)
	}
	if err != nil {
		return Allocation{}, unavailable(op, err)
	}
	a, err := decodeAllocation(raw)
	if err != nil {
		return Allocation{}, fmt.Errorf("capacity: %s: %w", op, err)
	}
	return a, nil
}

// Version returns the store-wide mutation counter: it grows with every
// change (register, reserve, release, fence, status, remove), so a reader
// holding a Snapshot can tell whether it is stale with one cheap call.
func (s *Store) Version(ctx context.Context) (uint64, error) {
	v, err := s.rdb.Get(ctx, s.keys.version()).Uint64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, unavailable("read version", err)
	}
	return v, nil
}

// Snapshot reads every node: static facts, status, epoch, what is free and
// what is allocated. It reads the version and the node list in one
// MULTI/EXEC, then the nodes in batches of DefaultSnapshotBatch, one MULTI/EXEC
// per batch; see the Snapshot type for what Version promises. Static facts
// and allocations that have not changed since the previous Snapshot of this
// Store are not decoded again.
func (s *Store) Snapshot(ctx context.Context) (Snapshot, error) {
	const op = "snapshot"
	var version *redis.StringCmd
	var members *redis.StringSliceCmd
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		version = p.Get(ctx, s.keys.version())
		members = p.SMembers(ctx, s.keys.nodes())
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return Snapshot{}, unavailable(op, err)
	}
	if err := members.Err(); err != nil {
		return Snapshot{}, unavailable(op, err)
	}
	var snap Snapshot
	if err := version.Err(); err == nil {
		if snap.Version, err = version.Uint64(); err != nil {
			return Snapshot{}, fmt.Errorf("capacity: %s: version: %w", op, err)
		}
	} else if !errors.Is(err, redis.Nil) {
		return Snapshot{}, unavailable(op, err)
	}
	ids := members.Val()
	slices.Sort(ids)
	s.mu.Lock()
	cache := s.cache.next()
	s.mu.Unlock()
	snap.Nodes = make([]NodeState, 0, len(ids))
	for batch := range slices.Chunk(ids, s.batch) {
		states, err := s.readNodes(ctx, op, cache, batch)
		if err != nil {
			return Snapshot{}, err
		}
		snap.Nodes = append(snap.Nodes, states...)
	}
	cache.prev = nil
	s.mu.Lock()
	s.cache = cache
	s.mu.Unlock()
	return snap, nil
}

// readNodes reads the given nodes atomically (HGETALL and HVALS of each in
// one MULTI/EXEC, which costs Redis about half what the same reads cost
// inside a Lua script), skipping those that do not exist; cache may be nil.
func (s *Store) readNodes(ctx context.Context, op string, cache *decodeCache, ids []string) ([]NodeState, error) {
	cmds, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for _, id := range ids {
			p.Do(ctx, "HGETALL", s.keys.node(id))
			p.Do(ctx, "HVALS", s.keys.allocs(id))
		}
		return nil
	})
	if err != nil {
		return nil, unavailable(op, err)
	}
	out := make([]NodeState, 0, len(ids))
	for i, id := range ids {
		fields := cmds[2*i].(*redis.Cmd).Val()
		allocs, _ := cmds[2*i+1].(*redis.Cmd).Val().([]any)
		st, ok, err := decodeNodeState(cache, id, fields, allocs)
		if err != nil {
			return nil, fmt.Errorf("capacity: %s: %w", op, err)
		}
		if ok {
			out = append(out, st)
		}
	}
	return out, nil
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

func unexpected(op string, res []any) error {
	return fmt.Errorf("capacity: %s: unexpected script reply %v", op, res)
}
