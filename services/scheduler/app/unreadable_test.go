package app_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

// badZone is a valid request of rental id on rental.<tenant>.requested
// but for its spec's zone, which is not UTF-8: it does not decode.
func badZone(t *testing.T, id, tenant string) []byte {
	t.Helper()
	data, err := proto.Marshal(requested(id, tenant, spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	zone := protowire.AppendTag(nil, 8, protowire.BytesType)
	zone = protowire.AppendBytes(zone, []byte{0xff, 0xfe})
	data = protowire.AppendTag(data, 4, protowire.BytesType) // a second spec merges into the first
	return protowire.AppendBytes(data, zone)
}

// A request the scheduler cannot use is dead-lettered with the reason
// and, whenever its rental id can be read, rejected on its subject's
// tenant (REJECT_REASON_INVALID_SPEC, saying why) without being placed: a
// JSON body, a protobuf body with a field that does not decode, and a
// decodable one without its envelope. Bytes with no readable rental id are
// only dead-lettered.
func TestAnUnusableRequestIsRejectedToItsTenantAndDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(gpuNode("n1", 1, capacity.MarketOnDemand))
	e.replica(testConfig(), time.Now)
	noMeta, err := proto.Marshal(&shizuv1.RentalRequested{RentalId: "no-meta", TenantId: "dev", Spec: spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND)})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		id, rental, says, deadLetter string
		data                         []byte
	}{
		{"json-1", "json-1", "is JSON", "decode",
			[]byte(`{"rental_id": "json-1", "tenant_id": "dev", "spec": {"gpu_count": 1, "milli_gpu": 1000, "plan": "PLAN_ON_DEMAND"}}`)},
		{"bad-field", "bad-field", "could not be used", "invalid UTF-8", badZone(t, "bad-field", "dev")},
		{"no-meta", "no-meta", "meta", "meta", noMeta},
		{"nothing", "", "", "decode", []byte{0xff, 0xff, 0xff, 0x01}},
	}
	for _, c := range cases {
		e.publishRaw(t, "rental.dev.requested", c.id, c.data)
	}
	for _, c := range cases {
		if reason := e.schedulerDeadLetter(t, c.id); !strings.Contains(reason, c.deadLetter) {
			t.Errorf("%s: dead letter reason %q, want it to say %q", c.id, reason, c.deadLetter)
		}
		if c.rental == "" {
			continue
		}
		rej := e.rejectedWith(t, c.rental)
		if rej.GetTenantId() != "dev" || rej.GetReason() != shizuv1.RejectReason_REJECT_REASON_INVALID_SPEC || !strings.Contains(rej.GetMessage(), c.says) {
			t.Errorf("%s: rejection %v, want one to dev saying %q", c.id, rej, c.says)
		}
	}
	e.seen.waitFor(t, time.Second, func(o *outcomes) error {
		for _, c := range cases {
			if err := noOutcomes(o, c.rental); err != nil {
				return err
			}
			if c.rental != "" && len(o.rejected[c.rental]) != 1 {
				return fmt.Errorf("%s rejected %d times", c.rental, len(o.rejected[c.rental]))
			}
		}
		return nil
	})
}
