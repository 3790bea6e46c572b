package bus

import (
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// Tenant binding. A tenant subject (rental.<tenant>.…, usage.<tenant>.…,
// invoice.<tenant>.…) names the tenant it speaks for, and permissions are
// granted on subjects, so the subject's tenant is the one a publisher was
// allowed to speak for. An event whose body names another tenant (a
// RentalRequested on rental.dev.requested with tenant_id "victim") is
// forged: every consumer terminates and dead-letters it with a reason
// naming both tenants, before any handler sees it, and ScanStream leaves it
// out of every history a service rebuilds its state from.

// tenantFields maps each carried event with a tenant_id string field to
// that field's number (read from the wire, without decoding the event).
var tenantFields = func() map[string]protowire.Number {
	out := map[string]protowire.Number{}
	for _, se := range carried {
		mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(se.Event))
		if err != nil {
			continue
		}
		fd := mt.Descriptor().Fields().ByName("tenant_id")
		if fd != nil && fd.Kind() == protoreflect.StringKind && fd.Cardinality() != protoreflect.Repeated {
			out[se.Event] = fd.Number()
		}
	}
	return out
}()

// TenantMismatch returns, for an event of type event on subject subj with
// payload data, the fault.ErrInvalid that a body naming another tenant
// than the subject is: nil when they agree, when subj is no tenant
// subject, when the event has no tenant_id field, or when the body sets
// none or does not parse (its decoder and validator report those).
func TenantMismatch(subj, event string, data []byte) error {
	num, ok := tenantFields[event]
	if !ok {
		return nil
	}
	want, ok := subject.TenantOf(subj)
	if !ok {
		return nil
	}
	got, ok := stringField(data, num)
	if !ok || got == "" || got == want {
		return nil
	}
	return fault.Invalid("tenant mismatch: subject %s names tenant %q, the %s body names tenant %q",
		subj, want, event, shizuv1.Truncate(got, 128))
}

// stringField reads the string field num of an encoded message as a
// decoder would (the last occurrence wins; absent is ""); false when data
// does not parse.
func stringField(data []byte, num protowire.Number) (string, bool) {
	var got string
	for len(data) > 0 {
		n, typ, l := protowire.ConsumeTag(data)
		if l < 0 {
			return "", false
		}
		data = data[l:]
		if n == num && typ == protowire.BytesType {
			v, l := protowire.ConsumeBytes(data)
			if l < 0 {
				return "", false
			}
			got, data = string(v), data[l:]
			continue
		}
		l = protowire.ConsumeFieldValue(n, typ, data)
		if l < 0 {
			return "", false
		}
		data = data[l:]
	}
	return got, true
}
