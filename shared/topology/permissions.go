package topology

import (
	"fmt"
	"slices"
	"strings"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// Permissions are the subjects a NATS user may publish to and subscribe to.
type Permissions struct {
	Publish   []string
	Subscribe []string
	// Responses lets the user publish one reply to each request it
	// received (nats-server's allow_responses), for its Answers.
	Responses bool
}

// Permissions derives the least privilege s needs: its event subjects, the
// JetStream API calls for its own consumers (create, info, next, ack), the
// dead-letter subjects of those consumers, heartbeat and bucket access,
// the requests it answers (subscribe, and one reply each) and those it
// asks. Replies arrive on _INBOX.
func (s Service) Permissions() Permissions {
	pub := slices.Clone(s.Publishes)
	pub = append(pub, "$JS.API.INFO")
	pub = append(pub, s.Asks...)
	streams := map[string]bool{}
	durables := make([]StreamConsumer, 0, len(s.Consumers)+len(s.ConsumerPrefixes))
	for _, c := range s.Consumers {
		durables = append(durables, StreamConsumer{c.Stream, c.Durable})
	}
	durables = append(durables, s.ConsumerPrefixes...)
	for _, d := range durables {
		streams[d.Stream] = true
		streams[StreamAdvisories] = true
		exhausted := bus.ExhaustedDurable(d.Durable)
		if d.Durable == "*" {
			exhausted = "*" // one durable per instance: "*-exhausted" would not be a wildcard
		}
		pub = append(pub,
			// The forwarder of its exhausted deliveries (bus.Consume starts it).
			fmt.Sprintf("$JS.API.CONSUMER.CREATE.%s.%s", StreamAdvisories, exhausted),
			fmt.Sprintf("$JS.API.CONSUMER.CREATE.%s.%s.>", StreamAdvisories, exhausted),
			fmt.Sprintf("$JS.API.CONSUMER.INFO.%s.%s", StreamAdvisories, exhausted),
			fmt.Sprintf("$JS.API.CONSUMER.MSG.NEXT.%s.%s", StreamAdvisories, exhausted),
			fmt.Sprintf("$JS.ACK.%s.%s.>", StreamAdvisories, exhausted),
			fmt.Sprintf("$JS.API.STREAM.MSG.GET.%s", d.Stream),
			fmt.Sprintf("$JS.API.CONSUMER.CREATE.%s.%s", d.Stream, d.Durable),
			fmt.Sprintf("$JS.API.CONSUMER.CREATE.%s.%s.>", d.Stream, d.Durable),
			fmt.Sprintf("$JS.API.CONSUMER.DURABLE.CREATE.%s.%s", d.Stream, d.Durable),
			fmt.Sprintf("$JS.API.CONSUMER.INFO.%s.%s", d.Stream, d.Durable),
			fmt.Sprintf("$JS.API.CONSUMER.MSG.NEXT.%s.%s", d.Stream, d.Durable),
			fmt.Sprintf("$JS.ACK.%s.%s.>", d.Stream, d.Durable),
			fmt.Sprintf(subject.DeadLetter, d.Stream, d.Durable))
	}
	for st := range streams {
		pub = append(pub, "$JS.API.STREAM.INFO."+st)
	}
	kvStream := "KV_" + HeartbeatBucket
	switch s.Heartbeats {
	case WritesHeartbeats:
		pub = append(pub, "$KV."+HeartbeatBucket+".>", "$JS.API.STREAM.INFO."+kvStream,
			"$JS.API.DIRECT.GET."+kvStream+".>")
	case WatchesHeartbeats:
		pub = append(pub, "$JS.API.STREAM.INFO."+kvStream, "$JS.API.DIRECT.GET."+kvStream+".>",
			"$JS.API.CONSUMER.CREATE."+kvStream+".>", "$JS.API.CONSUMER.DELETE."+kvStream+".>",
			"$JS.API.CONSUMER.INFO."+kvStream+".>", "$JS.FC."+kvStream+".>")
	}
	if s.ReadsLogs {
		pub = append(pub, logReader()...)
	}
	for _, b := range s.Buckets {
		pub = append(pub, b.permissions()...)
	}
	for _, st := range s.Reads {
		pub = append(pub, "$JS.API.STREAM.INFO."+st, "$JS.API.DIRECT.GET."+st, "$JS.API.DIRECT.GET."+st+".>", "$JS.API.STREAM.MSG.GET."+st)
	}
	slices.Sort(pub)
	sub := append([]string{"_INBOX.>"}, s.Answers...)
	return Permissions{Publish: slices.Compact(pub), Subscribe: sub, Responses: len(s.Answers) > 0}
}

// logReader is what shared/rentallogs needs on LOGS: the stream's info,
// direct gets (the last message of a subject, and the next one from a
// sequence), and ephemeral ordered consumers (create with a filter, pull,
// info, delete). None of it can change or purge the stream.
func logReader() []string {
	return []string{
		"$JS.API.STREAM.INFO." + StreamLogs,
		"$JS.API.DIRECT.GET." + StreamLogs,
		"$JS.API.DIRECT.GET." + StreamLogs + ".>",
		// With its one filter in the subject (as nats.go sends it), so a
		// later per-tenant reader can be narrowed to log.<tenant>.*.
		"$JS.API.CONSUMER.CREATE." + StreamLogs + ".*." + subject.LogAll,
		"$JS.API.CONSUMER.INFO." + StreamLogs + ".*",
		"$JS.API.CONSUMER.MSG.NEXT." + StreamLogs + ".*",
		"$JS.API.CONSUMER.DELETE." + StreamLogs + ".*",
	}
}

// AdminPermissions allow everything.
func AdminPermissions() Permissions {
	return Permissions{Publish: []string{">"}, Subscribe: []string{">"}}
}

// User is one NATS user of the platform.
type User struct {
	Name        string
	Permissions Permissions
}

// Users returns the admin user and one user per service, in a stable order.
func Users() []User {
	users := []User{{Name: Admin, Permissions: AdminPermissions()}}
	for _, s := range Services() {
		users = append(users, User{Name: s.Name, Permissions: s.Permissions()})
	}
	return users
}

// SystemUsers returns the users of the system account (SystemAccount): only
// FailoverAdvisories, who may read the disconnect advisories and publish
// nothing.
func SystemUsers() []User {
	return []User{{Name: FailoverAdvisories, Permissions: Permissions{Subscribe: []string{DisconnectAdvisories}}}}
}

// PasswordVar is the environment variable holding a user's password in
// deploy/nats/users.conf, e.g. SHIZU_NODE_AGENT_NATS_PASSWORD.
func PasswordVar(user string) string {
	return "SHIZU_" + strings.ToUpper(strings.ReplaceAll(user, "-", "_")) + "_NATS_PASSWORD"
}

// UsersConf renders the users block of a nats-server configuration, with
// passwords taken from environment variables (PasswordVar) at server start.
func UsersConf() string {
	var b strings.Builder
	b.WriteString("# Generated from shared/topology; do not edit. Regenerate with:\n")
	b.WriteString("#   go test ./shared/topology -run TestUsersConfIsCurrent -update\n")
	b.WriteString("# Passwords come from the environment of nats-server (one variable per user).\n")
	b.WriteString("authorization {\n  users: [\n")
	for _, u := range Users() {
		fmt.Fprintf(&b, "    {\n      user: %q\n      password: $%s\n      permissions: {\n", u.Name, PasswordVar(u.Name))
		writeList(&b, "publish", u.Permissions.Publish)
		writeList(&b, "subscribe", u.Permissions.Subscribe)
		if u.Permissions.Responses {
			b.WriteString("        allow_responses: true\n")
		}
		b.WriteString("      }\n    }\n")
	}
	b.WriteString("  ]\n}\n")
	// The users above are in the global account; the system account holds
	// the server's advisories, readable only by its own users.
	b.WriteString("\n# The system account: the server's own events (client connects and disconnects).\n")
	fmt.Fprintf(&b, "accounts {\n  %s: {\n    users: [\n", SystemAccount)
	for _, u := range SystemUsers() {
		fmt.Fprintf(&b, "      {\n        user: %q\n        password: $%s\n        permissions: {\n", u.Name, PasswordVar(u.Name))
		b.WriteString("          publish: { deny: [\">\"] }\n")
		b.WriteString("          subscribe: { allow: [")
		for i, sub := range u.Permissions.Subscribe {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%q", sub)
		}
		b.WriteString("] }\n        }\n      }\n")
	}
	b.WriteString("    ]\n  }\n}\n")
	fmt.Fprintf(&b, "system_account: %s\n", SystemAccount)
	return b.String()
}

func writeList(b *strings.Builder, key string, subjects []string) {
	fmt.Fprintf(b, "        %s: { allow: [", key)
	for i, s := range subjects {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(b, "%q", s)
	}
	b.WriteString("] }\n")
}

// permissions are the API subjects of a bucket's use: reading keys (direct
// get) and watching or listing them (an ordered consumer) for every user,
// and for its writer creating the bucket and putting and deleting keys.
func (b BucketAccess) permissions() []string {
	st := "KV_" + b.Bucket
	out := []string{"$JS.API.STREAM.INFO." + st, "$JS.API.CONSUMER.CREATE." + st, "$JS.API.DIRECT.GET." + st + ".>", "$JS.API.STREAM.MSG.GET." + st,
		"$JS.API.CONSUMER.CREATE." + st + ".>", "$JS.API.CONSUMER.DELETE." + st + ".>",
		"$JS.API.CONSUMER.INFO." + st + ".>", "$JS.FC." + st + ".>"}
	if b.Writes {
		out = append(out, "$KV."+b.Bucket+".>", "$JS.API.STREAM.CREATE."+st, "$JS.API.STREAM.UPDATE."+st)
	}
	return out
}
