// Command standin stands in for the node-agent binary in the autoscaler's
// tests: it writes its arguments and the SHIZU_* part of its environment to
// $STANDIN_DIR/<node-id>.started and, with STANDIN_REGISTER=1, registers
// its node (8 GPUs) in the capacity store at $SHIZU_REDIS_URL as a node
// agent would. It then waits for SIGTERM and writes <node-id>.stopped
// before exiting.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/shizu-gpu/shizu/shared/capacity"
)

// register puts the node in the capacity store, as a node agent does.
func register(id string) error {
	opts, err := redis.ParseURL(os.Getenv("SHIZU_REDIS_URL"))
	if err != nil {
		return err
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	store, err := capacity.New(rdb)
	if err != nil {
		return err
	}
	gpus := make([]capacity.GPU, 8)
	for i := range gpus {
		gpus[i] = capacity.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", id, i), Model: "H100-SXM5-80GB", VRAMMiB: 81920}
	}
	_, err = store.Register(context.Background(), capacity.Node{ID: id, Zone: os.Getenv("SHIZU_NODE_ZONE"),
		Market: capacity.Market(os.Getenv("SHIZU_NODE_MARKET")), PricePerGPUHourMicros: 2_490_000, Currency: "USD",
		CPUMilli: 180_000, MemoryMiB: 1_900_000, GPUs: gpus})
	return err
}

func main() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	fs := flag.NewFlagSet("standin", flag.ExitOnError)
	sim := fs.String("simulate", "", "")
	id := fs.String("node-id", "", "")
	_ = fs.Parse(os.Args[1:])
	dir := os.Getenv("STANDIN_DIR")
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "SHIZU_") {
			env = append(env, kv)
		}
	}
	sort.Strings(env)
	rec := "args=" + strings.Join(os.Args[1:], " ") + "\nsimulate=" + *sim + "\n" + strings.Join(env, "\n") + "\n"
	// Write then rename, so a reader never sees half a record.
	tmp := filepath.Join(dir, *id+".tmp")
	if err := os.WriteFile(tmp, []byte(rec), 0o644); err != nil {
		os.Exit(3)
	}
	if err := os.Rename(tmp, filepath.Join(dir, *id+".started")); err != nil {
		os.Exit(3)
	}
	if os.Getenv("STANDIN_REGISTER") == "1" {
		if err := register(*id); err != nil {
			fmt.Fprintln(os.Stderr, "standin: register:", err)
			os.Exit(4)
		}
	}
	<-sigs
	_ = os.WriteFile(filepath.Join(dir, *id+".stopped"), []byte("SIGTERM\n"), 0o644)
}
