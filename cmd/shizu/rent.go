package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/gpumodel"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// pendingGrace is how long `shizu rent` keeps waiting after a rental went
// pending before it reports so.
const pendingGrace = 3 * time.Second

// rentOptions are `shizu rent`'s flags, turned into a spec by spec().
type rentOptions struct {
	gpus      int
	fraction  string
	vram      string
	models    string
	nvlink    bool
	mig       string
	tee       bool
	zone      string
	plan      string
	maxPrice  string
	currency  string
	priority  int
	image     string
	ckpt      string
	labels    labelFlag
	cpuMilli  int64
	memoryMiB int64
	// pendingTimeout: how long the rental may wait for capacity (0: the
	// scheduler's default).
	pendingTimeout time.Duration
}

type labelFlag map[string]string

func (l labelFlag) String() string { return "" }
func (l labelFlag) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q is not key=value", v)
	}
	l[k] = val
	return nil
}

// parseFraction reads a GPU share as a decimal ("0.25", "1") or milli-GPU
// ("250m").
func parseFraction(s string) (int32, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 1000, nil
	}
	bad := usagef("-fraction %q: want a share of one GPU, 0.001..1 (\"0.25\") or milli-GPU 1..1000 (\"250m\")", s)
	var milli int
	switch whole, frac, dot := strings.Cut(s, "."); {
	case strings.HasSuffix(s, "m"):
		n, err := strconv.Atoi(strings.TrimSuffix(s, "m"))
		if err != nil {
			return 0, bad
		}
		milli = n
	case dot:
		if whole == "" {
			whole = "0"
		}
		if len(frac) == 0 || len(frac) > 3 || strings.HasPrefix(s, "-") {
			return 0, usagef("-fraction %q: at most three decimals (a milli-GPU)", s)
		}
		w, err1 := strconv.Atoi(whole)
		f, err2 := strconv.Atoi(frac + strings.Repeat("0", 3-len(frac)))
		if err1 != nil || err2 != nil || f < 0 {
			return 0, bad
		}
		milli = w*1000 + f
	case s == "1":
		milli = 1000
	default:
		return 0, usagef("-fraction %q: a share of one GPU is 0.001..1 (\"0.25\"); write milli-GPU with an m (\"250m\")", s)
	}
	if milli < 1 || milli > 1000 {
		return 0, bad
	}
	return int32(milli), nil
}

// parseMiB reads a memory size: "20480" (MiB), "20GiB", "20G", "512MiB".
func parseMiB(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	mult := int64(1)
	lower := strings.ToLower(s)
	for _, suf := range []struct {
		s string
		m int64
	}{{"gib", 1024}, {"gb", 1024}, {"g", 1024}, {"mib", 1}, {"mb", 1}, {"m", 1}} {
		if strings.HasSuffix(lower, suf.s) {
			lower, mult = strings.TrimSuffix(lower, suf.s), suf.m
			break
		}
	}
	n, err := strconv.ParseInt(lower, 10, 64)
	if err != nil || n < 0 {
		return 0, usagef("-vram %q: want MiB (\"20480\") or a size (\"20GiB\")", s)
	}
	return n * mult, nil
}

func (o rentOptions) spec(command []string) (*shizuv1.RentalSpec, error) {
	milli, err := parseFraction(o.fraction)
	if err != nil {
		return nil, err
	}
	vram, err := parseMiB(o.vram)
	if err != nil {
		return nil, err
	}
	plan, err := rent.ParsePlan(o.plan)
	if err != nil {
		return nil, usagef("-plan %q: want on-demand, reserved or spot (e.g. -plan spot)", o.plan)
	}
	s := &shizuv1.RentalSpec{GpuCount: int32(o.gpus), MilliGpu: milli, VramMib: vram, MigProfile: o.mig, TeeRequired: o.tee,
		Zone: o.zone, Plan: plan, Priority: int32(o.priority), Image: o.image, Command: command, CheckpointUri: o.ckpt,
		CpuMilli: o.cpuMilli, MemoryMib: o.memoryMiB}
	if o.gpus < 1 || o.gpus > 64 {
		return nil, usagef("-gpus %d: want 1..64 (all on one node)", o.gpus)
	}
	if milli < 1000 && s.VramMib == 0 {
		return nil, usagef("-fraction %s needs -vram: fractions of a GPU share its memory, so say how much (e.g. -vram 20GiB)", o.fraction)
	}
	if o.models != "" {
		for _, m := range strings.Split(o.models, ",") {
			m = strings.TrimSpace(m)
			if _, ok := gpumodel.Lookup(m); !ok {
				return nil, usagef("-model %q is not a known GPU model; known: %s", m, strings.Join(modelTokens(), ", "))
			}
			s.AllowedModels = append(s.AllowedModels, m)
		}
	}
	if o.nvlink {
		if o.gpus < 2 {
			return nil, usagef("-nvlink joins GPUs of one node: it needs -gpus 2 or more (got -gpus %d)", o.gpus)
		}
		s.Interconnect = shizuv1.Interconnect_INTERCONNECT_NVLINK
	}
	if o.mig != "" && (o.gpus != 1 || milli < 1000 || o.nvlink) {
		return nil, usagef("-mig %s is one whole MIG slice of one GPU: it takes neither -gpus above 1, -fraction nor -nvlink", o.mig)
	}
	if plan == shizuv1.Plan_PLAN_RESERVED && len(s.AllowedModels) == 0 {
		return nil, usagef("-plan reserved needs -model, the model of your reserved commitment: a reserved rental is billed against " +
			"the tenant's commitment for the model it runs on, and the scheduler refuses one without a commitment " +
			"(e.g. -plan reserved -model H100-SXM5-80GB; without a commitment rent -plan on-demand)")
	}
	if o.maxPrice != "" && plan != shizuv1.Plan_PLAN_SPOT {
		return nil, usagef("-max-price %s with -plan %s: a maximum price is only for -plan spot (e.g. -plan spot -max-price 1.20)", o.maxPrice, o.plan)
	}
	if o.maxPrice != "" {
		micros, err := rent.ParseMicros(o.maxPrice)
		if err != nil {
			return nil, usagef("-max-price: %w (e.g. -max-price 2.49)", err)
		}
		s.MaxSpotPricePerGpuHour = &shizuv1.Money{Micros: micros, Currency: o.currency}
	}
	if len(o.labels) > 0 {
		s.Labels = o.labels
	}
	switch {
	case o.pendingTimeout < 0:
		return nil, usagef("-pending-timeout %s: want a positive duration (e.g. -pending-timeout 30m), or 0 for the scheduler's default", o.pendingTimeout)
	case o.pendingTimeout > 0:
		s.PendingTimeout = durationpb.New(o.pendingTimeout)
	}
	return s, nil
}

func modelTokens() []string {
	var out []string
	for _, m := range gpumodel.All() {
		out = append(out, m.Token)
	}
	return out
}

var rentVerb = verb{
	name:    "rent",
	summary: "Rent GPUs: ask the gateway for a rental and wait briefly for the scheduler's answer.",
	usage:   "[flags] [-- command args...]",
	examples: `  shizu rent                                   # one whole GPU, on demand, default command
  shizu rent -gpus 2 -nvlink -model H100-SXM5-80GB -- python train.py
  shizu rent -fraction 0.25 -vram 20GiB        # a quarter of a GPU with 20 GiB of its memory
  shizu rent -mig 1g.10gb                      # one MIG slice
  shizu rent -plan spot -max-price 1.20        # spot, at most 1.20 per GPU-hour
  shizu rent -plan reserved -model H100-SXM5-80GB  # against your H100 commitment
  shizu rent -tee -model H200-SXM5-141GB       # confidential computing
  shizu rent -gpus 8 -pending-timeout 30m      # wait up to 30 minutes for capacity
  shizu rent -w                                # follow it until it runs (or is rejected)
  shizu rent -o json | jq -r .rental_id
`,
	setup: func(fs *flag.FlagSet) func(context.Context, []string, io.Writer) error {
		c := &rentCommand{o: rentOptions{labels: labelFlag{}}}
		c.register(fs)
		return c.run
	},
}

// rentCommand is `shizu rent`: its flags, and what it does with them.
type rentCommand struct {
	af      apiFlags
	tenant  *string
	id      *string
	idemKey *string
	wait    *time.Duration
	watch   *bool
	o       rentOptions
}

func (c *rentCommand) register(fs *flag.FlagSet) {
	c.af.register(fs)
	c.tenant = fs.String("tenant", "", "no longer taken: the tenant is the one your API key acts for")
	c.id = fs.String("id", "", "no longer taken: the platform assigns rental ids (see -idempotency-key)")
	c.idemKey = fs.String("idempotency-key", "", "Idempotency-Key of the request: a retry with the same key and flags returns the first answer and rents nothing more (default: a fresh one)")
	c.wait = fs.Duration("wait", 10*time.Second, "how long to wait for the outcome (0: do not wait)")
	c.watch = fs.Bool("w", false, "follow the rental's events, a line each, until it runs or is rejected (Ctrl-C to leave)")
	o := &c.o
	fs.IntVar(&o.gpus, "gpus", 1, "number of GPUs, all on one node")
	fs.StringVar(&o.fraction, "fraction", "", `share of one GPU: "0.25" or milli-GPU "250m" (needs -vram)`)
	fs.StringVar(&o.vram, "vram", "", `GPU memory per GPU: MiB ("20480") or "20GiB"`)
	fs.StringVar(&o.models, "model", "", "acceptable GPU models, comma-separated (e.g. H100-SXM5-80GB)")
	fs.BoolVar(&o.nvlink, "nvlink", false, "all GPUs in one NVLink domain (needs -gpus >= 2)")
	fs.StringVar(&o.mig, "mig", "", "MIG profile, e.g. 1g.10gb or 3g.40gb")
	fs.BoolVar(&o.tee, "tee", false, "run in a trusted execution environment (confidential computing)")
	fs.StringVar(&o.zone, "zone", "", "zone (default any)")
	fs.StringVar(&o.plan, "plan", "on-demand", "pricing plan: on-demand, reserved (needs -model, the model of your commitment) or spot")
	fs.StringVar(&o.maxPrice, "max-price", "", "spot only: highest price per GPU-hour, e.g. 1.20 (never placed on a node priced above it)")
	fs.StringVar(&o.currency, "currency", "USD", "currency of -max-price")
	fs.IntVar(&o.priority, "priority", 0, "order within the plan, 0..1000")
	fs.StringVar(&o.image, "image", "", "container image (the process runtime of shizu dev ignores it)")
	fs.StringVar(&o.ckpt, "checkpoint", "", "checkpoint URI a migrated rental resumes from")
	fs.Int64Var(&o.cpuMilli, "cpu-milli", 0, "host CPU in milli-cores (default: the node's share per GPU)")
	fs.Int64Var(&o.memoryMiB, "memory-mib", 0, "host memory in MiB (default: the node's share per GPU)")
	fs.Var(o.labels, "label", "key=value label copied onto usage records (repeatable)")
	fs.DurationVar(&o.pendingTimeout, "pending-timeout", 0,
		"how long the rental may wait for capacity before it is rejected, e.g. 30m (default: the scheduler's, 10m; at most its -max-pending-timeout)")
}

// run asks the gateway for the rental, follows its events until it has
// an outcome (or -wait passes; with -w until it runs or is rejected) and
// reports it.
func (c *rentCommand) run(ctx context.Context, args []string, stdout io.Writer) error {
	switch {
	case *c.tenant != "":
		return usagef("-tenant %s: the tenant is the one your API key acts for; use a key of that tenant (shizu login)", *c.tenant)
	case *c.id != "":
		return usagef("-id %s: the platform assigns rental ids; to make a retry safe pass the same -idempotency-key", *c.id)
	}
	spec, err := c.o.spec(args)
	if err != nil {
		return err
	}
	if err := spec.Validate(); err != nil {
		return invalid(err, rentFields)
	}
	api, err := c.af.client()
	if err != nil {
		return err
	}
	key := *c.idemKey
	if key == "" {
		key = newIdempotencyKey()
	}
	r := &rentalView{}
	if err := api.do(ctx, request{method: http.MethodPost, path: "/v1/rentals", body: specJSON(spec),
		header: http.Header{"Idempotency-Key": {key}}}, r); err != nil {
		return err
	}
	switch {
	case *c.watch:
		if r, err = c.watchRental(ctx, api, r, stdout); err != nil {
			return err
		}
	case *c.wait > 0:
		if r, err = followUntil(ctx, api, r, *c.wait, rentAnswered()); err != nil {
			return err
		}
	}
	if c.af.output == "json" {
		if err := printJSON(stdout, r); err != nil {
			return err
		}
		if r.State == stateRejected || r.State == stateStopped {
			return fmt.Errorf("rental %s %s: %s", r.ID, r.State, r.Why)
		}
		return nil
	}
	if *c.watch {
		return rentOutcomeError(r)
	}
	return printRentOutcome(stdout, r, *c.wait)
}

// watchRental prints a line for each state the rental passes through
// until it runs, is rejected or stops.
func (c *rentCommand) watchRental(ctx context.Context, api *apiClient, r *rentalView, stdout io.Writer) (*rentalView, error) {
	last := ""
	line := func(r *rentalView) {
		if c.af.output == "json" || r.State+r.Why == last {
			return
		}
		last = r.State + r.Why
		fmt.Fprintf(stdout, "%s  %s %s", time.Now().Format("15:04:05"), r.ID, r.State)
		if r.Node != "" {
			fmt.Fprintf(stdout, " on %s GPU %s (%s)", r.Node, joinInts(r.GPUs), r.Model)
		}
		if r.Why != "" {
			fmt.Fprintf(stdout, ": %s", r.Why)
		}
		fmt.Fprintln(stdout)
	}
	line(r)
	got, err := api.followEvents(ctx, r.ID, func(n *rentalView) bool {
		line(n)
		return n.State == stateRunning || n.State == stateRejected || n.State == stateStopped
	})
	if got == nil {
		got = r
	}
	return got, err
}

func rentOutcomeError(r *rentalView) error {
	switch r.State {
	case stateRejected:
		return errors.New("rental " + r.ID + " was rejected")
	case stateStopped:
		return errors.New("rental " + r.ID + " stopped at once: " + r.Why)
	}
	return nil
}

// followUntil follows the rental's events until done says so or wait
// passes, and returns its last state (r when the stream told nothing).
func followUntil(ctx context.Context, api *apiClient, r *rentalView, wait time.Duration, done func(*rentalView) bool) (*rentalView, error) {
	if done(r) {
		return r, nil
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	got, err := api.followEvents(ctx, r.ID, done)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
		err = nil // -wait passed: report the state as it is
	}
	if got == nil {
		got = r
	}
	return got, err
}

// rentAnswered says when `shizu rent` stops following: the rental left
// requested and scheduled, or has been pending for pendingGrace (it may be
// placed soon: the autoscaler may be provisioning a node for it).
func rentAnswered() func(*rentalView) bool {
	var pendingSince time.Time
	return func(r *rentalView) bool {
		if r.State != statePending {
			return r.State != stateRequested && r.State != stateScheduled
		}
		if pendingSince.IsZero() {
			pendingSince = time.Now()
		}
		return time.Since(pendingSince) >= pendingGrace
	}
}

// printRentOutcome writes the rental's state as a line; a rejected rental
// or one that stopped at once is an error.
func printRentOutcome(stdout io.Writer, r *rentalView, wait time.Duration) error {
	rid := r.ID
	switch r.State {
	case stateRunning:
		fmt.Fprintf(stdout, "%s running on %s GPU %s (%s)\n", rid, r.Node, joinInts(r.GPUs), r.Model)
	case stateScheduled:
		fmt.Fprintf(stdout, "%s scheduled on %s GPU %s (%s), not started yet\n", rid, r.Node, joinInts(r.GPUs), r.Model)
	case statePending:
		fmt.Fprintf(stdout, "%s pending: %s\n", rid, r.Why)
	case stateRejected:
		fmt.Fprintf(stdout, "%s rejected: %s\n", rid, r.Why)
	case stateStopped:
		fmt.Fprintf(stdout, "%s started on %s and stopped at once: %s (shizu show %s)\n", rid, r.Node, r.Why, rid)
	case stateRequested:
		fmt.Fprintf(stdout, "%s requested; no answer within %s (is the scheduler running?). Follow it with: shizu show %s\n", rid, wait, rid)
	default:
		fmt.Fprintf(stdout, "%s %s %s\n", rid, r.State, r.Why)
	}
	return rentOutcomeError(r)
}

// apiSpec is the API's RentalSpec (services/gateway/api/openapi.json):
// only what the flags set, the rest left to the platform's defaults.
type apiSpec struct {
	GPUCount       int32             `json:"gpu_count,omitempty"`
	MilliGPU       int32             `json:"milli_gpu,omitempty"`
	VRAMMiB        int64             `json:"vram_mib,omitempty"`
	AllowedModels  []string          `json:"allowed_models,omitempty"`
	Interconnect   string            `json:"interconnect,omitempty"`
	MIGProfile     string            `json:"mig_profile,omitempty"`
	TEERequired    bool              `json:"tee_required,omitempty"`
	Zone           string            `json:"zone,omitempty"`
	Plan           string            `json:"plan,omitempty"`
	MaxSpotPrice   *apiMoney         `json:"max_spot_price_per_gpu_hour,omitempty"`
	Priority       int32             `json:"priority,omitempty"`
	CPUMilli       int64             `json:"cpu_milli,omitempty"`
	MemoryMiB      int64             `json:"memory_mib,omitempty"`
	Image          string            `json:"image,omitempty"`
	Command        []string          `json:"command,omitempty"`
	CheckpointURI  string            `json:"checkpoint_uri,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
	PendingTimeout string            `json:"pending_timeout,omitempty"`
}

type apiMoney struct {
	Micros   int64  `json:"micros"`
	Currency string `json:"currency"`
}

func specJSON(s *shizuv1.RentalSpec) apiSpec {
	out := apiSpec{GPUCount: s.GetGpuCount(), MilliGPU: s.GetMilliGpu(), VRAMMiB: s.GetVramMib(), AllowedModels: s.GetAllowedModels(),
		MIGProfile: s.GetMigProfile(), TEERequired: s.GetTeeRequired(), Zone: s.GetZone(), Plan: planName(s.GetPlan()),
		Priority: s.GetPriority(), CPUMilli: s.GetCpuMilli(), MemoryMiB: s.GetMemoryMib(), Image: s.GetImage(),
		Command: s.GetCommand(), CheckpointURI: s.GetCheckpointUri(), Labels: s.GetLabels()}
	if s.GetInterconnect() == shizuv1.Interconnect_INTERCONNECT_NVLINK {
		out.Interconnect = "nvlink"
	}
	if m := s.GetMaxSpotPricePerGpuHour(); m != nil {
		out.MaxSpotPrice = &apiMoney{Micros: m.GetMicros(), Currency: m.GetCurrency()}
	}
	if d := s.GetPendingTimeout(); d != nil {
		out.PendingTimeout = d.AsDuration().String()
	}
	return out
}
