// Package capacity is Shizu's live-capacity store: what every GPU node has
// free right now, kept in Redis and changed only by atomic Lua scripts.
//
// The store answers one question fast and correctly: can this placement be
// committed? Scheduler replicas place optimistically from an in-memory
// [Snapshot] and commit through [Store.Reserve], a single script that checks
// the node (exists, ready, epoch unchanged), the host CPU and memory, and
// every GPU of the placement (free milli-GPU, free VRAM, a free sharer slot)
// and then writes all of it or nothing. A rejected reserve means "re-score and
// retry", never a double booking. Reserve and [Store.Release] are idempotent
// per rental id, so a caller that lost the reply can simply ask again.
//
// JetStream is the system of record for events; this store is the live view
// of what is allocated. A Redis that comes back empty (no persistence, a
// replaced primary) is rebuilt by its clients rather than read as "nothing is
// allocated": the store's generation (a random id, created by the first
// registration or restore into an empty store, [Store.Generation]) tells a
// node agent that the store it registered in is gone, and the agent puts its
// node back together with the allocations of the workloads it runs, in one
// script ([Store.Restore]), so no scheduler ever sees the node empty. Of a
// rental that two nodes restore (it moved while the store was lost), the
// higher placement attempt ([Placement.Attempt]) keeps it. The scheduler
// rebuilds its own records from JetStream (services/scheduler,
// docs/scheduler.md). What a restore cannot bring back is a fence that was
// lost with the store: a node fenced just before the loss comes back at the
// epoch its agent holds (docs/deploy.md, "Losing Redis").
//
// # Capacity units
//
// Every quantity is an integer: a GPU has [MilliPerGPU] (1000) milli-GPU,
// VRAM and host memory are MiB, host CPU is milli-cores. Each GPU also has a
// number of sharer slots (GPU.MaxSharers, default [DefaultMaxSharers]); each
// allocation that uses a GPU, whatever its size, takes one slot.
//
// # Epochs and fencing
//
// A node starts at epoch 1. Only [Store.Fence] moves the epoch (by one, and it
// marks the node dead), so an epoch is a fencing token: a reserve made with an
// old epoch fails with [ErrFenced], and an allocation recorded under an old
// epoch can never be renewed ([Store.Renew]) even after the node agent comes
// back and re-registers. Fenced allocations stay recorded, and keep holding
// their capacity, until the failover service releases them, so a failover
// replica that crashed halfway can read them again with [Store.Allocations].
//
// # Key layout
//
// With the default prefix "shizu" (see [WithPrefix]) the store uses:
//
//	shizu:node:{<node>}          hash    one node: static facts and live state
//	    spec                       JSON of the node's static facts (Node)
//	    status, epoch              "ready" | "draining" | "dead"; fencing epoch
//	    cpu_free, mem_free         host milli-CPU and MiB free
//	    gpus                       number of GPUs
//	    g<i>.milli, g<i>.vram      GPU i: free milli-GPU, free VRAM MiB
//	    g<i>.sharers, g<i>.max     GPU i: allocations on it, sharer limit
//	    g<i>.migmode               GPU i: "1" in MIG mode, "0" not (stores written
//	                               before MIG mode was tracked have only g<i>.mig,
//	                               MIG capability, read as not in MIG mode)
//	    g<i>.mi.<uuid>             GPU i's MIG instance: "" free, else the holding rental
//	    g<i>.mip.<uuid>            that instance's profile (a MIG share must match it)
//	    g<i>.health                GPU i: "degraded" | "failed" (absent when healthy;
//	                               SetGPUHealth, kept across registrations)
//	    model.<i>                  GPU i's model (what quotas count per model)
//	shizu:node:{<node>}:allocs   hash    rental id -> allocation JSON, for that node
//	shizu:rentals                hash    rental id -> allocation JSON (the rental -> node index)
//	shizu:nodes                  set     every registered node id
//	shizu:version                string  store-wide counter, +1 on every mutation
//	shizu:generation             string  the store's generation: a random id, set
//	                                     (SET NX) by the first Register/Join or
//	                                     Restore into a store that has none
//	shizu:usage                  hash    per-tenant usage in milli-GPU: field <tenant>
//	                                     its total, "<tenant> <model>" its total on
//	                                     a model (quota.go); absent fields are 0
//
// The two per-node keys share the {<node>} hash tag, so they live in one
// Redis Cluster slot. The allocation JSON is written to the node's allocs hash
// and to the rentals index by the same script, and removed together, so the
// two copies never disagree; the node's copy is what capacity is computed
// from, the index's copy answers "where is rental r?" in one read. The one
// exception is a hand-over (make-before-break, see handover.go): the old
// node's copy, marked handed over, stays without an index entry while the
// rental's next attempt is reserved, and indexed, on another node.
//
// Which operations touch which keys (each is one atomic step, except Release
// and Snapshot, noted below):
//
//	Register   node, allocs, nodes, version,           (one script; Join too)
//	           generation
//	Restore    rentals (read), then node, allocs,      (one script; retried when the
//	           nodes, version, rentals, generation,     index changed between the
//	           node and allocs of overtaken holders,     read and the script)
//	           usage
//	Reserve    node, allocs, rentals, version, usage   (one script)
//	Release    rentals (read), then node, allocs,      (one script; frees only the
//	           rentals, version, usage                  allocation the index still
//	                                                    names, else follows the
//	                                                    rental to its new node)
//	HandOver   allocs, rentals, version, usage         (one script; handover.go)
//	ReleaseOn  node, allocs, rentals, version, usage   (one script per rental,
//	                                                    pipelined)
//	Renew      node, allocs                            (one script, writes nothing)
//	Fence      node, allocs, version                   (one script)
//	SetStatus  node, version                           (one script)
//	Remove     node, allocs, nodes, version            (one script)
//	Node, Allocations  node, allocs                    (one MULTI/EXEC)
//	Allocation rentals                                 (one HGET)
//	Version    version                                 (one GET)
//	Generation generation                              (one GET)
//	Usage      usage                                   (HSCAN of the tenant's fields)
//	Snapshot   version + nodes (one MULTI/EXEC), then node and allocs of
//	           up to DefaultSnapshotBatch nodes per MULTI/EXEC, in sequence
//
// # Redis Cluster caveat
//
// Register, Restore, Reserve, Release and Remove are multi-key across hash slots: they
// combine a node's keys with the store-wide keys (rentals, nodes, version);
// a Snapshot batch reads the keys of many nodes in one MULTI/EXEC.
// That is atomic on a single Redis primary (with replicas, Sentinel or not),
// which is the deployment this package is written for. On Redis Cluster those
// scripts would fail with CROSSSLOT. To run on a Cluster unchanged, give the
// prefix its own hash tag, e.g. WithPrefix("{shizu}"): Redis hashes only the
// first {...} of a key, so every key then lands in one slot — correct, but the
// whole store lives on one shard. Spreading nodes over shards would mean giving
// up the store-wide version counter and checking rental idempotence per node.
//
// Lua scripts are loaded with redis.NewScript and run with EVALSHA, falling
// back to EVAL when the server answers NOSCRIPT (after a restart or SCRIPT
// FLUSH). Every script declares all the keys it touches in KEYS.
package capacity
