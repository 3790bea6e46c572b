package capacity_test

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

func TestNew(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { _ = rdb.Close() })
	tests := []struct {
		name string
		rdb  redis.UniversalClient
		opts []capacity.Option
		want []string
	}{
		{"the defaults are valid", rdb, nil, nil},
		{"a nil client is refused", nil, nil, []string{"redis client"}},
		{"an empty prefix and a zero batch are both reported", rdb,
			[]capacity.Option{capacity.WithPrefix(""), capacity.WithSnapshotBatch(0)}, []string{"prefix", "snapshot batch"}},
		{"a prefix with a space is refused", rdb, []capacity.Option{capacity.WithPrefix("a b")}, []string{"prefix"}},
		{"a nil clock is refused", rdb, []capacity.Option{capacity.WithClock(nil)}, []string{"clock"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := capacity.New(tt.rdb, tt.opts...)
			checkProblems(t, err, tt.want)
		})
	}
}

func TestRegister(t *testing.T) {
	t.Parallel()
	rdb := testkit.StartRedis(t).Client(t)

	t.Run("a new node starts at epoch 1, ready, with everything free", func(t *testing.T) {
		t.Parallel()
		s := storeOn(t, rdb, prefixFor(t))
		n := gpuNode("n1", 2)
		n.GPUs[1].MaxSharers = 7
		if epoch := mustRegister(t, s, n); epoch != 1 {
			t.Fatalf("epoch %d, want 1", epoch)
		}
		st := mustNode(t, s, "n1")
		if st.Status != capacity.StatusReady || st.Epoch != 1 {
			t.Fatalf("status %s epoch %d, want ready at 1", st.Status, st.Epoch)
		}
		if !reflect.DeepEqual(st.Node, n) {
			t.Fatalf("static facts changed on the way:\n got %+v\nwant %+v", st.Node, n)
		}
		want := []capacity.FreeGPU{
			{Index: 0, Milli: 1000, VRAMMiB: 80 * 1024, MaxSharers: capacity.DefaultMaxSharers},
			{Index: 1, Milli: 1000, VRAMMiB: 80 * 1024, MaxSharers: 7},
		}
		if !reflect.DeepEqual(st.FreeGPUs, want) || st.FreeCPUMilli != n.CPUMilli || st.FreeMemoryMiB != n.MemoryMiB {
			t.Fatalf("free %+v cpu %d mem %d, want %+v and the whole host", st.FreeGPUs, st.FreeCPUMilli, st.FreeMemoryMiB, want)
		}
	})

	t.Run("a restarted agent re-registers and keeps its epoch and allocations", func(t *testing.T) {
		t.Parallel()
		s := storeOn(t, rdb, prefixFor(t))
		epoch := mustRegister(t, s, gpuNode("n1", 2))
		mustReserve(t, s, place("r1", "n1", epoch, share(0, 500, 10240)))
		before := mustNode(t, s, "n1")
		if again := mustRegister(t, s, gpuNode("n1", 2)); again != epoch {
			t.Fatalf("epoch %d after re-register, want %d", again, epoch)
		}
		after := mustNode(t, s, "n1")
		if !reflect.DeepEqual(before, after) {
			t.Fatalf("re-register changed the node:\nbefore %+v\n after %+v", before, after)
		}
	})

	t.Run("new facts are taken and free is recomputed from the live allocations", func(t *testing.T) {
		t.Parallel()
		s := storeOn(t, rdb, prefixFor(t))
		epoch := mustRegister(t, s, gpuNode("n1", 2))
		mustReserve(t, s, place("r1", "n1", epoch, share(1, 250, 10240)))
		n := gpuNode("n1", 3)
		n.GPUs[1].VRAMMiB = 40 * 1024
		n.PricePerGPUHourMicros = 1_000_000
		mustRegister(t, s, n)
		st := mustNode(t, s, "n1")
		if len(st.FreeGPUs) != 3 || st.FreeGPUs[1].VRAMMiB != 30*1024 || st.FreeGPUs[1].Milli != 750 || st.PricePerGPUHourMicros != 1_000_000 {
			t.Fatalf("got %+v price %d", st.FreeGPUs, st.PricePerGPUHourMicros)
		}
	})

	t.Run("a fenced node comes back ready at its moved epoch", func(t *testing.T) {
		t.Parallel()
		s := storeOn(t, rdb, prefixFor(t))
		epoch := mustRegister(t, s, gpuNode("n1", 1))
		mustReserve(t, s, place("r1", "n1", epoch, share(0, 500, 1)))
		f, err := s.Fence(t.Context(), "n1", epoch)
		if err != nil {
			t.Fatal(err)
		}
		if again := mustRegister(t, s, gpuNode("n1", 1)); again != f.Epoch {
			t.Fatalf("epoch %d, want the fenced epoch %d", again, f.Epoch)
		}
		st := mustNode(t, s, "n1")
		if st.Status != capacity.StatusReady || len(st.Allocations) != 1 || st.FreeGPUs[0].Milli != 500 {
			t.Fatalf("status %s, allocations %d, free %+v: want ready, the fenced allocation still held", st.Status, len(st.Allocations), st.FreeGPUs)
		}
	})

	t.Run("a draining node stays draining when its agent re-registers", func(t *testing.T) {
		t.Parallel()
		s := storeOn(t, rdb, prefixFor(t))
		epoch := mustRegister(t, s, gpuNode("n1", 1))
		if err := s.SetStatus(t.Context(), "n1", capacity.StatusDraining, epoch); err != nil {
			t.Fatal(err)
		}
		n := gpuNode("n1", 1)
		n.Zone = "zone-b"
		mustRegister(t, s, n)
		if st := mustNode(t, s, "n1"); st.Status != capacity.StatusDraining || st.Zone != "zone-b" {
			t.Fatalf("status %s zone %s, want draining in zone-b", st.Status, st.Zone)
		}
	})

	t.Run("registering the same facts again does not move the version", func(t *testing.T) {
		t.Parallel()
		s := storeOn(t, rdb, prefixFor(t))
		mustRegister(t, s, gpuNode("n1", 2))
		v := mustVersion(t, s)
		mustRegister(t, s, gpuNode("n1", 2))
		if got := mustVersion(t, s); got != v {
			t.Fatalf("version %d, want %d", got, v)
		}
	})

	misfits := []struct {
		name   string
		mutate func(n *capacity.Node)
		want   string
	}{
		{"losing the GPU a rental uses", func(n *capacity.Node) {
			n.GPUs, n.NVLinkDomains = n.GPUs[:1], nil
			n.GPUs[0].NVLinkPeers = nil
		}, "uses GPU 1 but the node now has 1 GPUs"},
		{"VRAM shrinking below what is allocated", func(n *capacity.Node) { n.GPUs[0].VRAMMiB = 1024 }, "GPU 0 would have -10240 vram_mib free"},
		{"a sharer limit below the sharers", func(n *capacity.Node) { n.GPUs[0].MaxSharers = 1 }, "GPU 0 would have -1 sharer_slots free"},
		{"host memory shrinking below what is allocated", func(n *capacity.Node) { n.MemoryMiB = 1024 }, "the host would have"},
		{"a MIG slice on a GPU no longer in MIG mode", func(n *capacity.Node) { n.GPUs[1].MIGEnabled, n.GPUs[1].MIGInstances = false, nil },
			"MIG slice 1g.10gb on GPU 1"},
		{"a MIG instance a rental holds disappearing", func(n *capacity.Node) { n.GPUs[1].MIGInstances = n.GPUs[1].MIGInstances[1:] },
			"MIG instance MIG-n1-1a on GPU 1"},
		{"MIG mode on a time-shared GPU", func(n *capacity.Node) {
			n.GPUs[0].MIGEnabled = true
			n.GPUs[0].MIGInstances = []capacity.MIGInstance{{UUID: "MIG-n1-0a", Profile: "7g.80gb", VRAMMiB: 80 * 1024}}
		}, "time-shares GPU 0"},
	}
	for _, tt := range misfits {
		t.Run("new facts are refused and change nothing: "+tt.name, func(t *testing.T) {
			t.Parallel()
			s := storeOn(t, rdb, prefixFor(t))
			epoch := mustRegister(t, s, migNode("n1"))
			mustReserve(t, s, place("r1", "n1", epoch, share(0, 300, 10240)))
			mustReserve(t, s, place("r3", "n1", epoch, share(0, 100, 1024)))
			mig := place("r2", "n1", epoch, migShare(1, "MIG-n1-1a"))
			mig.CPUMilli, mig.MemoryMiB = 0, 0
			mustReserve(t, s, mig)
			before, v := mustNode(t, s, "n1"), mustVersion(t, s)
			n := migNode("n1")
			tt.mutate(&n)
			_, err := s.Register(t.Context(), n)
			if !capacity.IsConflict(err) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("want a conflict saying %q, got %v", tt.want, err)
			}
			if after := mustNode(t, s, "n1"); !reflect.DeepEqual(before, after) || mustVersion(t, s) != v {
				t.Fatalf("a refused register changed the node:\nbefore %+v\n after %+v", before, after)
			}
		})
	}

	t.Run("an invalid node is refused before anything touches Redis", func(t *testing.T) {
		t.Parallel()
		r := testkit.StartRedis(t)
		s, own := storeOn(t, r.Client(t)), r.Client(t)
		n := gpuNode("n1", 2)
		n.Currency = "dollars"
		n.GPUs[0].VRAMMiB = 0
		_, err := s.Register(t.Context(), n)
		checkProblems(t, err, []string{"Currency:", "GPUs[0].VRAMMiB:"})
		if size := own.DBSize(t.Context()).Val(); size != 0 {
			t.Fatalf("%d keys written", size)
		}
	})
}

func TestReserve(t *testing.T) {
	t.Parallel()
	rdb := testkit.StartRedis(t).Client(t)
	ctx := t.Context()

	// Every case runs on a fresh prefix holding node n1 (two GPUs) at
	// epoch 1, and node n2; setup may change that first.
	tests := []struct {
		name    string
		setup   func(t *testing.T, s *capacity.Store)
		place   capacity.Placement
		wantErr error
		// insufficient, when set, is the *InsufficientError wanted.
		insufficient *capacity.InsufficientError
		// existing: the reply is the earlier allocation of the same rental.
		existing bool
	}{
		{
			name:  "a placement that fits is recorded and takes its capacity",
			place: place("r1", "n1", 1, share(0, 500, 40960), share(1, 1000, 81920)),
		},
		{
			name:    "a placement on an unknown node is not found",
			place:   place("r1", "nowhere", 1, share(0, 500, 1)),
			wantErr: capacity.ErrNotFound,
		},
		{
			name:    "a placement made under the wrong epoch is fenced",
			place:   place("r1", "n1", 2, share(0, 500, 1)),
			wantErr: capacity.ErrFenced,
		},
		{
			name: "a placement on a dead node is fenced even with its new epoch",
			setup: func(t *testing.T, s *capacity.Store) {
				if _, err := s.Fence(t.Context(), "n1", 1); err != nil {
					t.Fatal(err)
				}
			},
			place:   place("r1", "n1", 2, share(0, 500, 1)),
			wantErr: capacity.ErrFenced,
		},
		{
			name: "a placement on a draining node is a conflict",
			setup: func(t *testing.T, s *capacity.Store) {
				if err := s.SetStatus(t.Context(), "n1", capacity.StatusDraining, 1); err != nil {
					t.Fatal(err)
				}
			},
			place:   place("r1", "n1", 1, share(0, 500, 1)),
			wantErr: capacity.ErrConflict,
		},
		{
			name: "insufficient VRAM on the second of two GPUs writes nothing",
			setup: func(t *testing.T, s *capacity.Store) {
				mustReserve(t, s, place("r0", "n1", 1, share(1, 100, 60*1024)))
			},
			place:        place("r1", "n1", 1, share(0, 500, 1024), share(1, 500, 30*1024)),
			insufficient: &capacity.InsufficientError{Node: "n1", GPU: 1, Resource: capacity.ResourceVRAM, Free: 20 * 1024, Want: 30 * 1024},
		},
		{
			name: "insufficient milli-GPU on the first GPU writes nothing",
			setup: func(t *testing.T, s *capacity.Store) {
				mustReserve(t, s, place("r0", "n1", 1, share(0, 800, 1)))
			},
			place:        place("r1", "n1", 1, share(0, 300, 1), share(1, 300, 1)),
			insufficient: &capacity.InsufficientError{Node: "n1", GPU: 0, Resource: capacity.ResourceMilliGPU, Free: 200, Want: 300},
		},
		{
			name: "a GPU with every sharer slot taken refuses one more",
			setup: func(t *testing.T, s *capacity.Store) {
				for i := range capacity.DefaultMaxSharers {
					mustReserve(t, s, place(fmt.Sprintf("r0-%d", i), "n1", 1, share(1, 100, 1)))
				}
			},
			place:        place("r1", "n1", 1, share(1, 100, 1)),
			insufficient: &capacity.InsufficientError{Node: "n1", GPU: 1, Resource: capacity.ResourceSharers, Free: 0, Want: 1},
		},
		{
			name: "insufficient host CPU is reported for the host, not a GPU",
			place: func() capacity.Placement {
				p := place("r1", "n1", 1, share(0, 100, 1))
				p.CPUMilli = 64_001
				return p
			}(),
			insufficient: &capacity.InsufficientError{Node: "n1", GPU: -1, Resource: capacity.ResourceCPU, Free: 64_000, Want: 64_001},
		},
		{
			name:    "a GPU the node does not have is invalid",
			place:   place("r1", "n1", 1, share(0, 100, 1), share(2, 100, 1)),
			wantErr: capacity.ErrInvalid,
		},
		{
			name:    "a MIG slice on a GPU not in MIG mode is a conflict",
			place:   place("r1", "n1", 1, migShare(0, "MIG-m1-1a")),
			wantErr: capacity.ErrConflict,
		},
		{
			name:  "a MIG slice takes the free instance it names",
			place: place("r1", "m1", 1, migShare(1, "MIG-m1-1a")),
		},
		{
			name:    "a MIG slice naming an instance the GPU does not have is a conflict",
			place:   place("r1", "m1", 1, migShare(1, "MIG-m1-1z")),
			wantErr: capacity.ErrConflict,
		},
		{
			name:    "a MIG slice naming an instance of another profile is a conflict",
			place:   place("r1", "m1", 1, migShare(1, "MIG-m1-1b")), // 1b is a 3g.40gb
			wantErr: capacity.ErrConflict,
		},
		{
			name: "a MIG instance held by another rental is insufficient",
			setup: func(t *testing.T, s *capacity.Store) {
				mustReserve(t, s, place("r0", "m1", 1, migShare(1, "MIG-m1-1a")))
			},
			place:        place("r1", "m1", 1, migShare(1, "MIG-m1-1a")),
			insufficient: &capacity.InsufficientError{Node: "m1", GPU: 1, Resource: capacity.ResourceMIGInstance, Free: 0, Want: 1},
		},
		{
			name:    "a time-shared slice of a GPU in MIG mode is a conflict",
			place:   place("r1", "m1", 1, share(1, 250, 1024)),
			wantErr: capacity.ErrConflict,
		},
		{
			name:    "an invalid placement is refused and changes nothing",
			place:   place("r1", "n1", 0, share(0, 0, 1)),
			wantErr: capacity.ErrInvalid,
		},
		{
			name: "reserving the same rental again returns the existing allocation",
			setup: func(t *testing.T, s *capacity.Store) {
				mustReserve(t, s, place("r1", "n1", 1, share(0, 500, 1)))
			},
			place:    place("r1", "n1", 1, share(0, 500, 1)),
			existing: true,
		},
		{
			name: "reserving the same rental on another node returns the existing allocation",
			setup: func(t *testing.T, s *capacity.Store) {
				mustReserve(t, s, place("r1", "n1", 1, share(0, 500, 1)))
			},
			place:    place("r1", "n2", 1, share(0, 1000, 1)),
			existing: true,
		},
		{
			name: "reserving the same rental after its node was fenced still returns the existing allocation",
			setup: func(t *testing.T, s *capacity.Store) {
				mustReserve(t, s, place("r1", "n1", 1, share(0, 500, 1)))
				if _, err := s.Fence(t.Context(), "n1", 1); err != nil {
					t.Fatal(err)
				}
			},
			place:    place("r1", "n1", 1, share(0, 500, 1)),
			existing: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := storeOn(t, rdb, prefixFor(t))
			mustRegister(t, s, gpuNode("n1", 2))
			plain := gpuNode("n2", 1)
			plain.GPUs[0].MIGCapable = false
			mustRegister(t, s, plain)
			mustRegister(t, s, migNode("m1"))
			if tt.setup != nil {
				tt.setup(t, s)
			}
			before, err := s.Snapshot(ctx)
			if err != nil {
				t.Fatal(err)
			}
			prior, priorErr := s.Allocation(ctx, tt.place.RentalID)

			got, err := s.Reserve(ctx, tt.place)

			after, serr := s.Snapshot(ctx)
			if serr != nil {
				t.Fatal(serr)
			}
			for _, st := range after.Nodes {
				if cerr := conserved(st); cerr != nil {
					t.Fatal(cerr)
				}
			}
			switch {
			case tt.insufficient != nil:
				var ie *capacity.InsufficientError
				if !errors.As(err, &ie) || !capacity.IsInsufficient(err) || *ie != *tt.insufficient {
					t.Fatalf("want %v, got %v", tt.insufficient, err)
				}
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("want %v, got %v", tt.wantErr, err)
				}
			case err != nil:
				t.Fatalf("reserve: %v", err)
			}
			if err != nil || tt.existing {
				// Nothing may change: same nodes, same free, same version.
				if !reflect.DeepEqual(before, after) {
					t.Fatalf("a reserve that wrote nothing changed the store:\nbefore %+v\n after %+v", before, after)
				}
				if tt.existing {
					if priorErr != nil || !got.Existing || !reflect.DeepEqual(got.Placement, prior.Placement) || !got.CreatedAt.Equal(prior.CreatedAt) {
						t.Fatalf("want the existing allocation %+v flagged Existing, got %+v", prior, got)
					}
				} else if _, aerr := s.Allocation(ctx, tt.place.RentalID); !capacity.IsNotFound(aerr) {
					t.Fatalf("a refused rental is recorded: %v", aerr)
				}
				return
			}
			if got.Existing || !reflect.DeepEqual(got.Placement, tt.place) {
				t.Fatalf("recorded %+v, want %+v", got, tt.place)
			}
			if after.Version != before.Version+1 {
				t.Fatalf("version %d -> %d, want +1", before.Version, after.Version)
			}
			st := mustNode(t, s, tt.place.NodeID)
			if len(st.Allocations) == 0 || !reflect.DeepEqual(st.Allocations[len(st.Allocations)-1].Placement, tt.place) {
				t.Fatalf("node allocations %+v do not hold %+v", st.Allocations, tt.place)
			}
		})
	}
}

func TestRelease(t *testing.T) {
	t.Parallel()
	rdb := testkit.StartRedis(t).Client(t)

	t.Run("releasing gives the capacity back exactly", func(t *testing.T) {
		t.Parallel()
		s := storeOn(t, rdb, prefixFor(t))
		mustRegister(t, s, gpuNode("n1", 2))
		mustReserve(t, s, place("r0", "n1", 1, share(1, 300, 7000)))
		before := mustNode(t, s, "n1")
		mustReserve(t, s, place("r1", "n1", 1, share(0, 500, 40960), share(1, 250, 1234)))
		released, err := s.Release(t.Context(), "r1")
		if err != nil || !released {
			t.Fatalf("released %v, err %v", released, err)
		}
		if after := mustNode(t, s, "n1"); !reflect.DeepEqual(before, after) {
			t.Fatalf("release did not restore the node:\nbefore %+v\n after %+v", before, after)
		}
		if _, err := s.Allocation(t.Context(), "r1"); !capacity.IsNotFound(err) {
			t.Fatalf("released rental still indexed: %v", err)
		}
	})

	t.Run("releasing twice changes nothing the second time", func(t *testing.T) {
		t.Parallel()
		s := storeOn(t, rdb, prefixFor(t))
		mustRegister(t, s, gpuNode("n1", 1))
		mustReserve(t, s, place("r1", "n1", 1, share(0, 500, 1)))
		if ok, err := s.Release(t.Context(), "r1"); !ok || err != nil {
			t.Fatalf("first release: %v %v", ok, err)
		}
		before, v := mustNode(t, s, "n1"), mustVersion(t, s)
		if ok, err := s.Release(t.Context(), "r1"); ok || err != nil {
			t.Fatalf("second release: released %v, err %v; want false, nil", ok, err)
		}
		if after := mustNode(t, s, "n1"); !reflect.DeepEqual(before, after) || mustVersion(t, s) != v {
			t.Fatalf("second release changed the node")
		}
	})

	t.Run("releasing a rental that never existed reports nothing released", func(t *testing.T) {
		t.Parallel()
		s := storeOn(t, rdb, prefixFor(t))
		if ok, err := s.Release(t.Context(), "ghost"); ok || err != nil {
			t.Fatalf("released %v, err %v", ok, err)
		}
	})

	t.Run("releasing a fenced allocation gives its capacity back on the dead node", func(t *testing.T) {
		t.Parallel()
		s := storeOn(t, rdb, prefixFor(t))
		mustRegister(t, s, gpuNode("n1", 1))
		mustReserve(t, s, place("r1", "n1", 1, share(0, 500, 1)))
		if _, err := s.Fence(t.Context(), "n1", 1); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.Release(t.Context(), "r1"); !ok || err != nil {
			t.Fatalf("released %v, err %v", ok, err)
		}
		if st := mustNode(t, s, "n1"); st.FreeGPUs[0].Milli != 1000 || len(st.Allocations) != 0 {
			t.Fatalf("got %+v", st)
		}
	})

	t.Run("an invalid rental id is refused", func(t *testing.T) {
		t.Parallel()
		s := storeOn(t, rdb, prefixFor(t))
		if _, err := s.Release(t.Context(), "a{b}"); !capacity.IsInvalid(err) {
			t.Fatalf("want invalid, got %v", err)
		}
	})
}

func TestRenew(t *testing.T) {
	t.Parallel()
	rdb := testkit.StartRedis(t).Client(t)
	tests := []struct {
		name    string
		setup   func(t *testing.T, s *capacity.Store) // n1 and n2 registered, r1 on n1 at epoch 1
		rental  string
		node    string
		epoch   uint64
		wantErr error
	}{
		{name: "an allocation under the node's epoch renews", rental: "r1", node: "n1", epoch: 1},
		{name: "an unknown node is not found", rental: "r1", node: "nowhere", epoch: 1, wantErr: capacity.ErrNotFound},
		{name: "an allocation on another node is not found", rental: "r1", node: "n2", epoch: 1, wantErr: capacity.ErrNotFound},
		{name: "a released allocation is not found", rental: "r1", node: "n1", epoch: 1, wantErr: capacity.ErrNotFound,
			setup: func(t *testing.T, s *capacity.Store) {
				if _, err := s.Release(t.Context(), "r1"); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "an agent holding an epoch the node has not reached is fenced", rental: "r1", node: "n1", epoch: 2, wantErr: capacity.ErrFenced},
		{name: "renewing after a fence fails", rental: "r1", node: "n1", epoch: 1, wantErr: capacity.ErrFenced,
			setup: fenceN1},
		{name: "renewing after a fence fails with the new epoch too", rental: "r1", node: "n1", epoch: 2, wantErr: capacity.ErrFenced,
			setup: fenceN1},
		{name: "a fenced allocation cannot be renewed even after the agent re-registers", rental: "r1", node: "n1", epoch: 2, wantErr: capacity.ErrFenced,
			setup: func(t *testing.T, s *capacity.Store) {
				fenceN1(t, s)
				mustRegister(t, s, gpuNode("n1", 2))
			}},
		{name: "an invalid rental id is refused", rental: "", node: "n1", epoch: 1, wantErr: capacity.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := storeOn(t, rdb, prefixFor(t))
			mustRegister(t, s, gpuNode("n1", 2))
			mustRegister(t, s, gpuNode("n2", 2))
			mustReserve(t, s, place("r1", "n1", 1, share(0, 500, 1)))
			if tt.setup != nil {
				tt.setup(t, s)
			}
			v := mustVersion(t, s)
			err := s.Renew(t.Context(), tt.rental, tt.node, tt.epoch)
			if (tt.wantErr == nil && err != nil) || !errors.Is(err, tt.wantErr) {
				t.Fatalf("want %v, got %v", tt.wantErr, err)
			}
			if mustVersion(t, s) != v {
				t.Fatalf("renew changed the version")
			}
		})
	}
}

func fenceN1(t *testing.T, s *capacity.Store) {
	t.Helper()
	if _, err := s.Fence(t.Context(), "n1", 1); err != nil {
		t.Fatal(err)
	}
}

func TestFence(t *testing.T) {
	t.Parallel()
	rdb := testkit.StartRedis(t).Client(t)

	t.Run("fencing moves the epoch, kills the node and hands back its allocations", func(t *testing.T) {
		t.Parallel()
		s := storeOn(t, rdb, prefixFor(t))
		mustRegister(t, s, gpuNode("n1", 2))
		a2 := mustReserve(t, s, place("r2", "n1", 1, share(1, 1000, 1)))
		a1 := mustReserve(t, s, place("r1", "n1", 1, share(0, 500, 1)))
		v := mustVersion(t, s)
		f, err := s.Fence(t.Context(), "n1", 1)
		if err != nil {
			t.Fatal(err)
		}
		if f.Epoch != 2 || !reflect.DeepEqual(f.Allocations, []capacity.Allocation{a1, a2}) {
			t.Fatalf("got %+v", f)
		}
		st := mustNode(t, s, "n1")
		if st.Status != capacity.StatusDead || st.Epoch != 2 || mustVersion(t, s) != v+1 {
			t.Fatalf("status %s epoch %d", st.Status, st.Epoch)
		}
		// A failover that crashed after the fence reads them again.
		again, err := s.Allocations(t.Context(), "n1")
		if err != nil || !reflect.DeepEqual(again, f.Allocations) {
			t.Fatalf("allocations after fence: %+v, %v", again, err)
		}
	})

	t.Run("fencing with a stale epoch is a conflict and changes nothing", func(t *testing.T) {
		t.Parallel()
		s := storeOn(t, rdb, prefixFor(t))
		mustRegister(t, s, gpuNode("n1", 1))
		fenceN1(t, s)
		before := mustNode(t, s, "n1")
		if _, err := s.Fence(t.Context(), "n1", 1); !capacity.IsConflict(err) {
			t.Fatalf("want conflict, got %v", err)
		}
		if after := mustNode(t, s, "n1"); !reflect.DeepEqual(before, after) {
			t.Fatal("a lost fence changed the node")
		}
	})

	t.Run("of several failover replicas fencing at once exactly one wins", func(t *testing.T) {
		t.Parallel()
		s := storeOn(t, rdb, prefixFor(t))
		mustRegister(t, s, gpuNode("n1", 1))
		mustReserve(t, s, place("r1", "n1", 1, share(0, 500, 1)))
		const replicas = 8
		var wg sync.WaitGroup
		errs := make([]error, replicas)
		results := make([]capacity.FenceResult, replicas)
		start := make(chan struct{})
		for i := range replicas {
			wg.Go(func() {
				<-start
				results[i], errs[i] = s.Fence(t.Context(), "n1", 1)
			})
		}
		close(start)
		wg.Wait()
		winners := 0
		for i, err := range errs {
			switch {
			case err == nil:
				winners++
				if results[i].Epoch != 2 || len(results[i].Allocations) != 1 {
					t.Errorf("winner got %+v", results[i])
				}
			case !capacity.IsConflict(err):
				t.Errorf("loser %d: want conflict, got %v", i, err)
			}
		}
		if winners != 1 {
			t.Fatalf("%d replicas won the fence, want exactly 1", winners)
		}
		if st := mustNode(t, s, "n1"); st.Epoch != 2 {
			t.Fatalf("epoch %d, want 2: the epoch moved once", st.Epoch)
		}
	})

	t.Run("no reserve succeeds on a fenced node with the old epoch", func(t *testing.T) {
		t.Parallel()
		s := storeOn(t, rdb, prefixFor(t))
		mustRegister(t, s, gpuNode("n1", 1))
		fenceN1(t, s)
		if _, err := s.Reserve(t.Context(), place("r1", "n1", 1, share(0, 100, 1))); !capacity.IsFenced(err) {
			t.Fatalf("reserve on the dead node: want fenced, got %v", err)
		}
		mustRegister(t, s, gpuNode("n1", 1)) // the agent comes back: ready at epoch 2
		if _, err := s.Reserve(t.Context(), place("r1", "n1", 1, share(0, 100, 1))); !capacity.IsFenced(err) {
			t.Fatalf("reserve with the old epoch after re-register: want fenced, got %v", err)
		}
		mustReserve(t, s, place("r1", "n1", 2, share(0, 100, 1)))
	})

	t.Run("fencing an unknown node is not found", func(t *testing.T) {
		t.Parallel()
		s := storeOn(t, rdb, prefixFor(t))
		if _, err := s.Fence(t.Context(), "nowhere", 1); !capacity.IsNotFound(err) {
			t.Fatalf("want not found, got %v", err)
		}
	})
}

func TestSetStatus(t *testing.T) {
	t.Parallel()
	rdb := testkit.StartRedis(t).Client(t)
	tests := []struct {
		name    string
		setup   func(t *testing.T, s *capacity.Store)
		status  capacity.NodeStatus
		epoch   uint64
		wantErr error
		want    capacity.NodeStatus
	}{
		{name: "a ready node can be drained", status: capacity.StatusDraining, epoch: 1, want: capacity.StatusDraining},
		{name: "a draining node can be made ready again", status: capacity.StatusReady, epoch: 1, want: capacity.StatusReady,
			setup: func(t *testing.T, s *capacity.Store) {
				if err := s.SetStatus(t.Context(), "n1", capacity.StatusDraining, 1); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "a stale epoch is a conflict", status: capacity.StatusDraining, epoch: 7, wantErr: capacity.ErrConflict, want: capacity.StatusReady},
		{name: "a dead node cannot be revived by status", status: capacity.StatusReady, epoch: 2, wantErr: capacity.ErrFenced, want: capacity.StatusDead,
			setup: fenceN1},
		{name: "dead is not a status to set: that is what Fence is for", status: capacity.StatusDead, epoch: 1, wantErr: capacity.ErrInvalid, want: capacity.StatusReady},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := storeOn(t, rdb, prefixFor(t))
			mustRegister(t, s, gpuNode("n1", 1))
			if tt.setup != nil {
				tt.setup(t, s)
			}
			err := s.SetStatus(t.Context(), "n1", tt.status, tt.epoch)
			if (tt.wantErr == nil && err != nil) || !errors.Is(err, tt.wantErr) {
				t.Fatalf("want %v, got %v", tt.wantErr, err)
			}
			if st := mustNode(t, s, "n1"); st.Status != tt.want {
				t.Fatalf("status %s, want %s", st.Status, tt.want)
			}
		})
	}
	t.Run("an unknown node is not found", func(t *testing.T) {
		t.Parallel()
		s := storeOn(t, rdb, prefixFor(t))
		if err := s.SetStatus(t.Context(), "nowhere", capacity.StatusDraining, 1); !capacity.IsNotFound(err) {
			t.Fatalf("want not found, got %v", err)
		}
	})
}

func TestRemove(t *testing.T) {
	t.Parallel()
	rdb := testkit.StartRedis(t).Client(t)

	t.Run("a node holding allocations cannot be removed", func(t *testing.T) {
		t.Parallel()
		s := storeOn(t, rdb, prefixFor(t))
		mustRegister(t, s, gpuNode("n1", 1))
		mustReserve(t, s, place("r1", "n1", 1, share(0, 100, 1)))
		if err := s.Remove(t.Context(), "n1"); !capacity.IsConflict(err) {
			t.Fatalf("want conflict, got %v", err)
		}
		mustNode(t, s, "n1")
	})

	t.Run("an empty node is removed from reads and snapshots", func(t *testing.T) {
		t.Parallel()
		s := storeOn(t, rdb, prefixFor(t))
		mustRegister(t, s, gpuNode("n1", 1))
		mustRegister(t, s, gpuNode("n2", 1))
		if err := s.Remove(t.Context(), "n1"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Node(t.Context(), "n1"); !capacity.IsNotFound(err) {
			t.Fatalf("want not found, got %v", err)
		}
		if _, err := s.Allocations(t.Context(), "n1"); !capacity.IsNotFound(err) {
			t.Fatalf("want not found, got %v", err)
		}
		snap, err := s.Snapshot(t.Context())
		if err != nil || len(snap.Nodes) != 1 || snap.Nodes[0].ID != "n2" {
			t.Fatalf("snapshot %+v, %v", snap, err)
		}
		if err := s.Remove(t.Context(), "n1"); !capacity.IsNotFound(err) {
			t.Fatalf("removing twice: want not found, got %v", err)
		}
	})
}

func TestSnapshot(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, capacity.WithSnapshotBatch(2)) // 5 nodes: three batches

	empty, err := s.Snapshot(t.Context())
	if err != nil || empty.Version != 0 || len(empty.Nodes) != 0 {
		t.Fatalf("empty store: %+v, %v", empty, err)
	}
	for _, id := range []string{"n3", "n1", "n5", "n2", "n4"} {
		mustRegister(t, s, gpuNode(id, 2))
	}
	mustReserve(t, s, place("r1", "n4", 1, share(1, 500, 1024)))
	snap, err := s.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if snap.Version != 6 || len(snap.Nodes) != 5 {
		t.Fatalf("version %d with %d nodes, want 6 and 5", snap.Version, len(snap.Nodes))
	}
	for i, st := range snap.Nodes {
		if st.ID != fmt.Sprintf("n%d", i+1) {
			t.Fatalf("node %d is %s: want sorted by id", i, st.ID)
		}
		if err := conserved(st); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(st, mustNode(t, s, st.ID)) {
			t.Fatalf("snapshot of %s differs from Node", st.ID)
		}
	}
	if got := snap.Nodes[3]; len(got.Allocations) != 1 || got.FreeGPUs[1].Milli != 500 {
		t.Fatalf("n4: %+v", got)
	}
	if v := mustVersion(t, s); v != snap.Version {
		t.Fatalf("nothing changed, yet version %d != snapshot's %d", v, snap.Version)
	}
	if _, err := s.Release(t.Context(), "r1"); err != nil {
		t.Fatal(err)
	}
	if v := mustVersion(t, s); v <= snap.Version {
		t.Fatalf("after a release the version %d should be past the snapshot's %d", v, snap.Version)
	}
}

func TestEveryMutationMovesTheVersion(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := t.Context()
	steps := []struct {
		name string
		do   func() error
	}{
		{"register", func() error { _, err := s.Register(ctx, gpuNode("n1", 1)); return err }},
		{"register with new facts", func() error { n := gpuNode("n1", 1); n.Zone = "z2"; _, err := s.Register(ctx, n); return err }},
		{"reserve", func() error { _, err := s.Reserve(ctx, place("r1", "n1", 1, share(0, 1, 1))); return err }},
		{"release", func() error { _, err := s.Release(ctx, "r1"); return err }},
		{"drain", func() error { return s.SetStatus(ctx, "n1", capacity.StatusDraining, 1) }},
		{"fence", func() error { _, err := s.Fence(ctx, "n1", 1); return err }},
		{"re-register a dead node", func() error { _, err := s.Register(ctx, gpuNode("n1", 1)); return err }},
		{"remove", func() error { return s.Remove(ctx, "n1") }},
	}
	last := mustVersion(t, s)
	for _, step := range steps {
		if err := step.do(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		v := mustVersion(t, s)
		if v != last+1 {
			t.Fatalf("%s: version %d -> %d, want +1", step.name, last, v)
		}
		last = v
	}
}

func TestScriptsAreReloadedAfterTheServerForgetsThem(t *testing.T) {
	t.Parallel()
	s, rdb := newStore(t)
	mustRegister(t, s, gpuNode("n1", 1))
	if err := rdb.ScriptFlush(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, s, place("r1", "n1", 1, share(0, 100, 1)))
	if err := rdb.ScriptFlush(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	mustNode(t, s, "n1")
}

func TestRedisDownIsUnavailable(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	s := storeOn(t, rdb)
	if _, err := s.Reserve(t.Context(), place("r1", "n1", 1, share(0, 100, 1))); !capacity.IsUnavailable(err) {
		t.Fatalf("want unavailable, got %v", err)
	}
}

// With a prefix that is itself a hash tag every key hashes to one Redis
// Cluster slot; with the default prefix a node's keys share its own tag.
func TestKeysShareAHashTag(t *testing.T) {
	t.Parallel()
	for _, prefix := range []string{"{shizu}", capacity.DefaultPrefix} {
		t.Run("prefix "+prefix, func(t *testing.T) {
			t.Parallel()
			s, rdb := newStore(t, capacity.WithPrefix(prefix))
			mustRegister(t, s, gpuNode("n1", 1))
			mustRegister(t, s, gpuNode("n2", 1))
			mustReserve(t, s, place("r1", "n2", 1, share(0, 100, 1)))
			keys, err := rdb.Keys(t.Context(), "*").Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(keys) != 8 { // n1 has no allocations, so no allocs hash
				t.Fatalf("keys %v: want node hashes, n2's allocs, rentals, nodes, version, generation and usage", keys)
			}
			for _, k := range keys {
				tag := hashTag(k)
				switch {
				case prefix == "{shizu}" && tag != "shizu":
					t.Errorf("key %s hashes on %q, want every key on \"shizu\"", k, tag)
				case prefix != "{shizu}" && strings.Contains(k, ":node:") && tag != strings.Split(strings.Split(k, "{")[1], "}")[0]:
					t.Errorf("node key %s hashes on %q", k, tag)
				}
			}
		})
	}
}

// hashTag is the part of a key Redis Cluster hashes: the first non-empty {...}.
func hashTag(key string) string {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return key
	}
	end := strings.IndexByte(key[open+1:], '}')
	if end <= 0 {
		return key
	}
	return key[open+1 : open+1+end]
}

// Snapshot reuses what it decoded last time; what it returns must still be
// the caller's own, and changed facts must show.
func TestSnapshotsDoNotShareWhatTheyReturn(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	mustRegister(t, s, gpuNode("n1", 2))
	mustReserve(t, s, place("r1", "n1", 1, share(0, 500, 1024)))
	first, err := s.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := mustNode(t, s, "n1")
	n := &first.Nodes[0]
	n.GPUs[0].Model = "scribbled"
	n.GPUs[0].NVLinkPeers[0] = 99
	n.NVLinkDomains[0][0] = 99
	n.Labels["pool"] = "scribbled"
	n.Allocations[0].GPUs[0].Milli = 1
	second, err := s.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(second.Nodes[0], want) {
		t.Fatalf("a caller's change leaked into the next snapshot:\n got %+v\nwant %+v", second.Nodes[0], want)
	}
	changed := gpuNode("n1", 2)
	changed.Labels["pool"] = "a100"
	mustRegister(t, s, changed)
	third, err := s.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if third.Nodes[0].Labels["pool"] != "a100" {
		t.Fatalf("new facts not in the snapshot: %+v", third.Nodes[0].Labels)
	}
}
