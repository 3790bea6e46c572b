package app

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shizu-gpu/shizu/services/autoscaler/provider"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// fleetStore keeps what the fleet is doing in Redis, shared by every
// replica of the autoscaler and kept across restarts:
//
//   - a claim per waiting rental that nodes are being provisioned for
//     (<prefix>:autoscaler:{fleet}:claim:<rental> = the claiming shortage,
//     with a TTL), taken all or nothing by one script, so two replicas
//     handling shortage reports for the same rentals provision once;
//   - the nodes the autoscaler provisioned (hash
//     <prefix>:autoscaler:{fleet}:nodes, node id -> JSON), so the fleet's
//     size counts against max_nodes across replicas and a restarted
//     replica still drains and releases the nodes it did not start.
//
// Every key carries the hash tag {fleet}, so the scripts' keys share one
// slot.
type fleetStore struct {
	rdb    *redis.Client
	prefix string
	// marker: as stateStore's; a claim is refused without it.
	marker string
}

// provisionedNode is one node the autoscaler asked the provider for.
type provisionedNode struct {
	ID           string          `json:"id"`
	InstanceType string          `json:"instance_type"`
	Market       provider.Market `json:"market"`
	Zone         string          `json:"zone"`
	// Pool it was provisioned for ("fleet" for a capacity shortage).
	Pool      string    `json:"pool"`
	CreatedAt time.Time `json:"created_at"`
}

func (f fleetStore) nodesKey() string { return f.prefix + ":autoscaler:{fleet}:nodes" }

func (f fleetStore) claimKey(rental string) string {
	return f.prefix + ":autoscaler:{fleet}:claim:" + rental
}

// claimScript claims every key for ARGV[1] (the owner) with a TTL of
// ARGV[2] ms, or none: it returns the indexes (1-based) of the keys another
// owner holds, empty when the claim was taken. A key the same owner holds
// already counts as claimed (a redelivered shortage).
var claimScript = redis.NewScript(`
local taken = {}
for i, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  if v and v ~= ARGV[1] then table.insert(taken, i) end
end
if #taken > 0 then return taken end
for _, k in ipairs(KEYS) do redis.call('SET', k, ARGV[1], 'PX', ARGV[2]) end
return taken
`)

// unclaimScript drops the keys ARGV[1] holds (a provisioning that failed).
var unclaimScript = redis.NewScript(`
for _, k in ipairs(KEYS) do
  if redis.call('GET', k) == ARGV[1] then redis.call('DEL', k) end
end
return 0
`)

// covered reports which of rentals are claimed by a provisioning in flight.
func (f fleetStore) covered(ctx context.Context, rentals []string) (map[string]bool, error) {
	out := map[string]bool{}
	if len(rentals) == 0 {
		return out, nil
	}
	keys := make([]string, len(rentals))
	for i, r := range rentals {
		keys[i] = f.claimKey(r)
	}
	vals, err := f.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, fault.Unavailable("read provisioning claims: %w", err)
	}
	for i, v := range vals {
		if v != nil {
			out[rentals[i]] = true
		}
	}
	return out, nil
}

// claim takes rentals for owner until ttl passes, all or nothing; it
// returns the rentals someone else holds (nil when the claim was taken).
func (f fleetStore) claim(ctx context.Context, rentals []string, owner string, ttl time.Duration) ([]string, error) {
	if len(rentals) == 0 {
		return nil, nil
	}
	if err := intact(ctx, f.rdb, f.marker); err != nil {
		return nil, err
	}
	keys := make([]string, len(rentals))
	for i, r := range rentals {
		keys[i] = f.claimKey(r)
	}
	idx, err := claimScript.Run(ctx, f.rdb, keys, owner, max(ttl.Milliseconds(), 1)).Int64Slice()
	if err != nil {
		return nil, fault.Unavailable("claim rentals for provisioning: %w", err)
	}
	var taken []string
	for _, i := range idx {
		taken = append(taken, rentals[i-1])
	}
	return taken, nil
}

// unclaim gives back what owner claimed of rentals.
func (f fleetStore) unclaim(ctx context.Context, rentals []string, owner string) error {
	if len(rentals) == 0 {
		return nil
	}
	keys := make([]string, len(rentals))
	for i, r := range rentals {
		keys[i] = f.claimKey(r)
	}
	if err := unclaimScript.Run(ctx, f.rdb, keys, owner).Err(); err != nil {
		return fault.Unavailable("give back provisioning claims: %w", err)
	}
	return nil
}

// addNodes records provisioned nodes.
func (f fleetStore) addNodes(ctx context.Context, nodes []provisionedNode) error {
	if len(nodes) == 0 {
		return nil
	}
	vals := make([]any, 0, 2*len(nodes))
	for _, n := range nodes {
		data, err := json.Marshal(n)
		if err != nil {
			return err
		}
		vals = append(vals, n.ID, data)
	}
	if err := f.rdb.HSet(ctx, f.nodesKey(), vals...).Err(); err != nil {
		return fault.Unavailable("record provisioned nodes: %w", err)
	}
	return nil
}

// nodes returns the provisioned nodes, sorted by id.
func (f fleetStore) nodes(ctx context.Context) ([]provisionedNode, error) {
	raw, err := f.rdb.HGetAll(ctx, f.nodesKey()).Result()
	if err != nil {
		return nil, fault.Unavailable("read provisioned nodes: %w", err)
	}
	out := make([]provisionedNode, 0, len(raw))
	for id, data := range raw {
		var n provisionedNode
		if err := json.Unmarshal([]byte(data), &n); err != nil {
			return nil, fmt.Errorf("provisioned node %s: %w", id, err)
		}
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b provisionedNode) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// removeNode forgets a released node.
func (f fleetStore) removeNode(ctx context.Context, id string) error {
	if err := f.rdb.HDel(ctx, f.nodesKey(), id).Err(); err != nil {
		return fault.Unavailable("forget released node %s: %w", id, err)
	}
	return nil
}
