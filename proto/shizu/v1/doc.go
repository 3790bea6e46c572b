// Package shizuv1 is Shizu's event contract, version 1: the protobuf
// messages every service publishes and consumes on NATS JetStream, generated
// from proto/shizu/v1/*.proto by scripts/genproto.sh, plus hand-written
// Validate methods (validate.go).
//
// One message per fact, named in the past tense; each event starts with an
// EventMeta whose event_id is the Nats-Msg-Id. Money is integer micro-units
// (Money), never a float. Changes are additive only; a breaking change goes
// to shizu/v2.
//
// Do not edit the *.pb.go files: change the .proto files and run
// scripts/genproto.sh.
package shizuv1
