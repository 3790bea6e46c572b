package app_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

func TestAReservedRequestWithoutACommitmentIsRejectedWithWhatIsMissing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(gpuNode("n1", 4, capacity.MarketOnDemand))
	accounts := filepath.Join(t.TempDir(), "accounts.json")
	if err := os.WriteFile(accounts, []byte(`{"commitments":[{"tenant_id":"acme","model":"H100-SXM5-80GB","gpu_count":2,"term":"year",
		"start":"2026-01-01T00:00:00Z","discount_percent":70}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.AccountsPath = accounts
	e.replica(cfg, time.Now)
	reserved := func(models ...string) *shizuv1.RentalSpec {
		sp := spec(1, 1000, 0, shizuv1.Plan_PLAN_RESERVED)
		sp.AllowedModels = models
		return sp
	}
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	e.publish(requested("committed", "acme", reserved("H100-SXM5-80GB"), at),
		requested("any-model", "acme", reserved(), at),
		requested("uncommitted", "globex", reserved("H100-SXM5-80GB"), at))
	want := map[string]string{"any-model": "allowed_models", "uncommitted": "tenant globex holds no reserved commitment"}
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		if len(o.scheduled["committed"]) != 1 {
			return fmt.Errorf("the reserved rental of acme's committed H100s: %d scheduled", len(o.scheduled["committed"]))
		}
		for id, says := range want {
			if len(o.rejected[id]) != 1 {
				return fmt.Errorf("%s: %d rejections, %d scheduled", id, len(o.rejected[id]), len(o.scheduled[id]))
			}
			r := o.rejected[id][0]
			if r.GetReason() != shizuv1.RejectReason_REJECT_REASON_INVALID_SPEC || !strings.Contains(r.GetMessage(), says) {
				return fmt.Errorf("%s: %v %q, want a message naming %q", id, r.GetReason(), r.GetMessage(), says)
			}
		}
		return nil
	})
}
