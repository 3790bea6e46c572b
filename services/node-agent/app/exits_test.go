package app_test

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// stoppedOf waits for rental's RentalStopped (among every stop on the
// tenant's subject: other tests' rentals share it).
func stoppedOf(t *testing.T, e *env, rental string) *shizuv1.RentalStopped {
	t.Helper()
	return eventOf[*shizuv1.RentalStopped](t, e, "rental.acme.stopped", rental)
}

// startedOf waits for rental's RentalStarted.
func startedOf(t *testing.T, e *env, rental string) *shizuv1.RentalStarted {
	t.Helper()
	return eventOf[*shizuv1.RentalStarted](t, e, "rental.acme.started", rental)
}

func eventOf[E interface {
	proto.Message
	GetRentalId() string
}](t *testing.T, e *env, subj, rental string) E {
	t.Helper()
	var got E
	testkit.Eventually(t, 20*time.Second, func() error {
		for _, ev := range all[E](t, e, topology.StreamRentals, subj) {
			if ev.GetRentalId() == rental {
				got = ev
				return nil
			}
		}
		return errors.New("no " + subj + " of " + rental + " yet")
	})
	return got
}

// A workload prints what it likes: a tqdm bar of █ (three bytes each) cut
// anywhere, and bytes that are not UTF-8 at all. Its stop must still be
// reported, valid UTF-8, and so must every later exit on the node.
func TestAWorkloadPrintingAProgressBarAndRawBytesIsReportedAndSoIsTheNextExit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	killWorkloads(t, dir)
	e.start(t, e.config(t, "n-raw", "rtx4090x8", dir))
	e.registered(t, "n-raw", 1)
	script := `printf '\377\376 '; i=0; while [ $i -lt 300 ]; do printf '█'; i=$((i+1)); done; printf ' 57%%| 3.2it/s\n'; exit 3`
	e.send(t, "n-raw", "start", e.place(t, "n-raw", 1, "r-raw", 500, 8192, "sh", "-c", script))
	raw := stoppedOf(t, e, "r-raw")
	if err := raw.Validate(); err != nil {
		t.Fatal(err)
	}
	if m := raw.GetMessage(); raw.GetExitCode() != 3 || raw.GetExitReason() != shizuv1.ExitReason_EXIT_REASON_FAILED ||
		!utf8.ValidString(m) || !strings.HasPrefix(m, "\uFFFD ██") || strings.Trim(m, "\uFFFD █") != "" {
		t.Fatalf("stopped = %v, want exit code 3, the raw bytes replaced and the bar's whole runes", raw)
	}

	e.send(t, "n-raw", "start", e.place(t, "n-raw", 1, "r-after", 500, 8192, "sh", "-c", "echo done"))
	after := stoppedOf(t, e, "r-after")
	if after.GetExitReason() != shizuv1.ExitReason_EXIT_REASON_COMPLETED || after.GetMessage() != "done" {
		t.Fatalf("stopped = %v", after)
	}
}
