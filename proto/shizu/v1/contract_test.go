package shizuv1

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"
)

// files are the schema files of the package, as compiled into the Go code
// (a function: the generated init functions set the descriptors after
// package variables are initialized).
func files() []protoreflect.FileDescriptor {
	return []protoreflect.FileDescriptor{
		File_shizu_v1_common_proto,
		File_shizu_v1_rental_proto,
		File_shizu_v1_node_proto,
		File_shizu_v1_scaling_proto,
		File_shizu_v1_billing_proto,
		File_shizu_v1_market_proto,
		File_shizu_v1_command_proto,
		File_shizu_v1_logs_proto,
	}
}

// parts are the messages that are not events: building blocks of events.
var parts = []string{
	"EventMeta", "Money", "MigInstance", "ResourceVector",
	"RentalSpec", "GpuAssignment",
	"Gpu", "NVLinkDomain", "GpuTelemetry",
	"InvoiceLineItem",
	"LogLine",
}

// fullSpec sets every field of RentalSpec.
func fullSpec() *RentalSpec {
	return &RentalSpec{
		GpuCount:               4,
		MilliGpu:               1000,
		VramMib:                81559,
		AllowedModels:          []string{"H100-SXM5-80GB", "H200-SXM5-141GB"},
		Interconnect:           Interconnect_INTERCONNECT_NVLINK,
		MigProfile:             "",
		TeeRequired:            true,
		Zone:                   "eu-west-1a",
		Plan:                   Plan_PLAN_SPOT,
		MaxSpotPricePerGpuHour: usd(1_750_000),
		Priority:               10,
		CpuMilli:               32_000,
		MemoryMib:              262_144,
		RequiredCapabilities:   []string{"fp8", "rt-cores"},
		Image:                  "ghcr.io/acme/trainer:1.4",
		Command:                []string{"torchrun", "--nproc-per-node=4", "train.py"},
		CheckpointUri:          "s3://acme-ckpt/run-7/",
		Labels:                 map[string]string{"team": "vision", "run": "7"},
		PendingTimeout:         durationpb.New(30 * time.Minute),
	}
}

// fullRentalRequested sets every field of a RentalRequested and its meta.
func fullRentalRequested() *RentalRequested {
	return &RentalRequested{
		Meta: &EventMeta{
			EventId:       "0193a6c2-7f1e-7c3a-9b2d-5e4f3a2b1c0d",
			OccurredAt:    at(1234567891 * time.Nanosecond),
			Source:        "api",
			CausationId:   "http:req-9",
			CorrelationId: "r-42",
		},
		RentalId: "r-42",
		TenantId: "acme",
		Spec:     fullSpec(),
	}
}

// unsetFields names the fields of m (recursively through singular
// messages) that hold their zero value, except those listed in allowed.
func unsetFields(m protoreflect.Message, prefix string, allowed ...string) []string {
	var out []string
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		path := prefix + string(f.Name())
		if slices.Contains(allowed, path) {
			continue
		}
		if !m.Has(f) {
			out = append(out, path)
			continue
		}
		if f.Kind() == protoreflect.MessageKind && !f.IsList() && !f.IsMap() &&
			f.Message().FullName().Parent() == "shizu.v1" {
			out = append(out, unsetFields(m.Get(f).Message(), path+".", allowed...)...)
		}
	}
	return out
}

func TestAFullRentalRequestedSurvivesARoundTrip(t *testing.T) {
	in := fullRentalRequested()
	// MIG excludes NVLink and more than one GPU, so a full spec leaves it
	// empty; everything else must be set, so a new field cannot slip past
	// this test.
	if unset := unsetFields(in.ProtoReflect(), "", "spec.mig_profile"); len(unset) > 0 {
		t.Fatalf("the fixture leaves fields unset: %v; set them in fullRentalRequested", unset)
	}
	if err := in.Validate(); err != nil {
		t.Fatalf("Validate() = %v, want nil", err)
	}

	t.Run("in the binary wire format", func(t *testing.T) {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(in)
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		var out RentalRequested
		if err := proto.Unmarshal(b, &out); err != nil {
			t.Fatalf("Unmarshal: %v", err)
		}
		if !proto.Equal(in, &out) {
			t.Fatalf("round trip changed the message:\n in: %v\nout: %v", in, &out)
		}
		if err := out.Validate(); err != nil {
			t.Fatalf("Validate() after the round trip = %v", err)
		}
		again, err := proto.MarshalOptions{Deterministic: true}.Marshal(&out)
		if err != nil {
			t.Fatalf("Marshal again: %v", err)
		}
		if string(again) != string(b) {
			t.Fatal("deterministic marshalling of the decoded message gave other bytes")
		}
	})

	t.Run("in JSON", func(t *testing.T) {
		b, err := protojson.Marshal(in)
		if err != nil {
			t.Fatalf("protojson.Marshal: %v", err)
		}
		var out RentalRequested
		if err := protojson.Unmarshal(b, &out); err != nil {
			t.Fatalf("protojson.Unmarshal: %v", err)
		}
		if !proto.Equal(in, &out) {
			t.Fatalf("JSON round trip changed the message:\n in: %v\nout: %v", in, &out)
		}
	})
}

func TestEveryEventFollowsTheContract(t *testing.T) {
	withFixture := map[protoreflect.FullName]bool{}
	for _, m := range validEvents() {
		withFixture[m.ProtoReflect().Descriptor().FullName()] = true
	}
	seenParts := map[string]bool{}
	for _, fd := range files() {
		msgs := fd.Messages()
		for i := range msgs.Len() {
			md := msgs.Get(i)
			name := string(md.Name())
			if slices.Contains(parts, name) {
				seenParts[name] = true
				if md.Fields().ByName("meta") != nil {
					t.Errorf("%s is listed as a part but has a meta field; is it an event?", name)
				}
				continue
			}
			t.Run(name+" is an event that follows the contract", func(t *testing.T) {
				f := md.Fields().ByNumber(1)
				if f == nil || f.Name() != "meta" || f.Message() == nil || f.Message().FullName() != "shizu.v1.EventMeta" {
					t.Errorf("field 1 is %v, want `EventMeta meta = 1;` (or add %s to parts if it is not an event)", f, name)
				}
				if !withFixture[md.FullName()] {
					t.Errorf("no valid fixture in validEvents()")
				}
				mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
				if err != nil {
					t.Fatal(err)
				}
				v, ok := mt.Zero().Interface().(interface{ Validate() error })
				if !ok {
					t.Fatalf("has no Validate() error method")
				}
				if err := v.Validate(); err == nil {
					t.Errorf("Validate() of a nil %s = nil, want missing", name)
				}
			})
		}
	}
	for _, p := range parts {
		if !seenParts[p] {
			t.Errorf("part %s is not a message of the package any more; remove it from parts", p)
		}
	}
}

var moneyName = regexp.MustCompile(`(^|_)(price|amount|total|cost)(_|$)`)

func TestSchemaConventions(t *testing.T) {
	for _, fd := range files() {
		t.Run(string(fd.Path())+" follows the naming conventions", func(t *testing.T) {
			if fd.Syntax() != protoreflect.Proto3 {
				t.Errorf("syntax is %v, want proto3", fd.Syntax())
			}
			if fd.Package() != "shizu.v1" {
				t.Errorf("package is %s, want shizu.v1", fd.Package())
			}
			enums := fd.Enums()
			for i := range enums.Len() {
				checkEnum(t, enums.Get(i))
			}
			msgs := fd.Messages()
			for i := range msgs.Len() {
				checkMessage(t, msgs.Get(i))
			}
		})
	}
}

// upperSnake turns "NodeLostReason" into "NODE_LOST_REASON".
func upperSnake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return strings.ToUpper(b.String())
}

func checkEnum(t *testing.T, ed protoreflect.EnumDescriptor) {
	t.Helper()
	prefix := upperSnake(string(ed.Name())) + "_"
	values := ed.Values()
	if zero := values.ByNumber(0); zero == nil || string(zero.Name()) != prefix+"UNSPECIFIED" || values.Get(0) != zero {
		t.Errorf("enum %s: the first value must be %sUNSPECIFIED = 0", ed.Name(), prefix)
	}
	for i := range values.Len() {
		if v := values.Get(i); !strings.HasPrefix(string(v.Name()), prefix) {
			t.Errorf("enum %s: value %s lacks the prefix %s", ed.Name(), v.Name(), prefix)
		}
	}
}

func checkMessage(t *testing.T, md protoreflect.MessageDescriptor) {
	t.Helper()
	fields := md.Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		name := string(f.Name())
		if name != strings.ToLower(name) {
			t.Errorf("%s.%s: field names are lower_snake_case", md.Name(), name)
		}
		if moneyName.MatchString(name) && (f.Message() == nil || f.Message().FullName() != "shizu.v1.Money") {
			t.Errorf("%s.%s looks like money but is %v, not shizu.v1.Money", md.Name(), name, f.Kind())
		}
	}
}

// declaration matches the lines of a .proto file that declare something a
// reader needs explained: messages, enums, fields and enum values.
var declaration = regexp.MustCompile(`^\s*(message\s+\w+\s*\{|enum\s+\w+\s*\{|(repeated\s+|optional\s+)?(map<[^>]+>|[\w.]+)\s+\w+\s*=\s*\d+\s*;|[A-Z][A-Z0-9_]*\s*=\s*\d+\s*;)`)

func TestEveryDeclarationInTheProtoFilesIsDocumented(t *testing.T) {
	paths, err := filepath.Glob("*.proto")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no .proto files beside the test (err %v)", err)
	}
	if len(paths) != len(files()) {
		t.Errorf("%d .proto files but %d compiled into Go; run scripts/genproto.sh and update files", len(paths), len(files()))
	}
	for _, path := range paths {
		t.Run(path+" documents every declaration", func(t *testing.T) {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(string(b), "\n")
			for i, line := range lines {
				if !declaration.MatchString(line) {
					continue
				}
				if i == 0 || !strings.HasPrefix(strings.TrimSpace(lines[i-1]), "//") {
					t.Errorf("%s:%d: %q has no comment on the line above", path, i+1, strings.TrimSpace(line))
				}
			}
		})
	}
}
