package main

import (
	"regexp"
	"strings"
	"sync"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// The one place the CLI turns what the platform says in its contract's
// terms into people's words: enum values (REJECT_REASON_UNSATISFIABLE is
// "unsatisfiable", PLAN_ON_DEMAND "on-demand", INTERCONNECT_NVLINK
// "NVLink") and field names (spec.mig_profile is the -mig the user typed).
// Every message the CLI prints about a rental (its why, its timeline) and
// every validation error of what it publishes goes through here.

// fieldWords maps a contract field name to what the user typed for it: a
// flag ("-mig") or an argument ("pool id").
type fieldWords map[string]string

// rentFields are the RentalRequested fields `shizu rent` sets, by flag.
var rentFields = fieldWords{
	"gpu_count": "-gpus", "milli_gpu": "-fraction", "vram_mib": "-vram", "allowed_models": "-model",
	"interconnect": "-nvlink", "mig_profile": "-mig", "tee_required": "-tee", "zone": "-zone", "plan": "-plan",
	"max_spot_price_per_gpu_hour": "-max-price", "priority": "-priority", "image": "-image",
	"checkpoint_uri": "-checkpoint", "cpu_milli": "-cpu-milli", "memory_mib": "-memory-mib", "labels": "-label",
	"pending_timeout": "-pending-timeout", "command": "the command after --", "reason": "-reason",
	// The platform sets these (the gateway: the key's tenant, its id, the
	// key that asks), so they are named, not flagged.
	"rental_id": "rental id", "tenant_id": "tenant", "requested_by": "requester",
}

// enumWords is every enum value name of the contract with its words.
var enumWords = sync.OnceValue(func() map[string]string {
	out := map[string]string{}
	add := func(enums protoreflect.EnumDescriptors) {
		for i := range enums.Len() {
			e := enums.Get(i)
			prefix := upperSnake(string(e.Name())) + "_"
			for j := range e.Values().Len() {
				name := string(e.Values().Get(j).Name())
				out[name] = valueWords(strings.TrimPrefix(name, prefix))
			}
		}
	}
	pkg := shizuv1.File_shizu_v1_rental_proto.Package()
	protoregistry.GlobalFiles.RangeFilesByPackage(pkg, func(fd protoreflect.FileDescriptor) bool {
		add(fd.Enums())
		for i := range fd.Messages().Len() {
			add(fd.Messages().Get(i).Enums())
		}
		return true
	})
	return out
})

// upperSnake turns an enum's name into its values' prefix: RejectReason
// is REJECT_REASON.
func upperSnake(name string) string {
	var b strings.Builder
	for i, r := range name {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return strings.ToUpper(b.String())
}

// valueWords is an enum value without its prefix in words: ON_DEMAND is
// "on-demand", NO_CAPACITY "no capacity", NVLINK "NVLink".
func valueWords(v string) string {
	switch v {
	case "ON_DEMAND":
		return "on-demand"
	case "NVLINK":
		return "NVLink"
	case "PCIE":
		return "PCIe"
	}
	words := strings.Split(strings.ToLower(v), "_")
	for i, w := range words {
		switch w {
		case "gpu", "tee", "mig", "ecc", "xid", "cpu":
			words[i] = strings.ToUpper(w)
		}
	}
	return strings.Join(words, " ")
}

// enumText is an enum value in words ("degraded", "heartbeat expired").
func enumText(v interface{ String() string }) string {
	if w, ok := enumWords()[v.String()]; ok {
		return w
	}
	return strings.ToLower(strings.ReplaceAll(v.String(), "_", " "))
}

var (
	enumName = regexp.MustCompile(`\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b`)
	// fieldPath is a field named with its path in a message
	// ("spec.mig_profile", "spec.allowed_models[1]", "labels[\"team\"]");
	// fieldName a snake_case name anywhere.
	fieldPath = regexp.MustCompile(`\b(?:spec|meta)\.([a-z][a-z0-9_]*)((?:\[[^\]]*\])?)`)
	fieldName = regexp.MustCompile(`\b([a-z][a-z0-9]*(?:_[a-z0-9]+)+)\b`)
	// milliCount is "milli_gpu 250": a share the user writes as -fraction 250m.
	milliCount = regexp.MustCompile(`\bmilli_gpu (\d+)\b`)
	// lineBreaks separate the problems of a validation error.
	lineBreaks = strings.NewReplacer("\r\n", "; ", "\n", "; ")
)

// said is a message of the platform (a rejection's reason, a validation
// error) in people's words, on one line: enum value names become words,
// and the fields of fields become what the user typed. A plain-word field
// ("zone", "plan") is replaced only where it is named as a field: with
// its message's path ("spec.zone") or as the subject of a problem
// ("zone: ...").
func said(s string, fields fieldWords) string {
	if s == "" {
		return s
	}
	s = lineBreaks.Replace(s)
	s = enumName.ReplaceAllStringFunc(s, func(name string) string {
		if w, ok := enumWords()[name]; ok {
			return w
		}
		return name
	})
	if fields == nil {
		return s
	}
	if f, ok := fields["milli_gpu"]; ok {
		s = milliCount.ReplaceAllString(s, f+" ${1}m")
	}
	s = fieldPath.ReplaceAllStringFunc(s, func(m string) string {
		sub := fieldPath.FindStringSubmatch(m)
		f, ok := fields[sub[1]]
		if !ok {
			return m
		}
		if idx := sub[2]; strings.HasPrefix(idx, `["`) {
			return f + " " + strings.TrimSuffix(strings.TrimPrefix(idx, "["), "]")
		}
		return f
	})
	s = fieldName.ReplaceAllStringFunc(s, func(name string) string {
		if f, ok := fields[name]; ok {
			return f
		}
		return name
	})
	// A plain-word field as the subject of a problem: "zone: ...".
	parts := strings.Split(s, "; ")
	for i, p := range parts {
		if name, rest, ok := strings.Cut(p, ": "); ok && !strings.ContainsAny(name, " -") {
			if f, ok := fields[name]; ok {
				parts[i] = f + ": " + rest
			}
		}
	}
	return strings.Join(parts, "; ")
}

// inPeoplesWords renders what a rental's events say (its why, its
// timeline, why each run ended) with said: the flags of `shizu rent`.
func (r *rentalView) inPeoplesWords() {
	r.Why = said(r.Why, rentFields)
	for i := range r.Timeline {
		r.Timeline[i].Detail = said(r.Timeline[i].Detail, rentFields)
	}
	for i := range r.Segments {
		r.Segments[i].Reason = said(r.Segments[i].Reason, rentFields)
	}
}

// invalid is a validation error of an event the CLI built from a command
// line, as a usage error in people's words: the fields named by the flags
// of fields.
func invalid(err error, fields fieldWords) error {
	return usagef("%s", said(err.Error(), fields))
}
