package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestAMistypedFlagIsOneLineWithAHint: an unknown flag or a bad value is
// one line naming it, the closest flag when there is one, and where the
// help is; exit 2, nothing on stdout, never the whole usage.
func TestAMistypedFlagIsOneLineWithAHint(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"rent names the flag it guesses", []string{"rent", "-gpuz", "2"},
			"shizu rent: flag provided but not defined: -gpuz; did you mean -gpus? (see 'shizu rent -h')"},
		{"a flag after the positional argument is checked too", []string{"show", "r-1", "-oo", "json"},
			"shizu show: flag provided but not defined: -oo; did you mean -o? (see 'shizu show -h')"},
		{"a prefix of a flag is guessed", []string{"ls", "-act"},
			"shizu ls: flag provided but not defined: -act; did you mean -active? (see 'shizu ls -h')"},
		{"nothing is guessed when nothing is close", []string{"bill", "-zzzzzzzz"},
			"shizu bill: flag provided but not defined: -zzzzzzzz (see 'shizu bill -h')"},
		{"a bad number names the flag", []string{"rent", "-gpus", "two"},
			`shizu rent: invalid value "two" for flag -gpus: parse error (see 'shizu rent -h')`},
		{"a duration without a unit names the flag", []string{"stop", "r-1", "-wait", "10"},
			`shizu stop: invalid value "10" for flag -wait: parse error (see 'shizu stop -h')`},
		{"a bad label says why", []string{"rent", "-label", "team"},
			`shizu rent: invalid value "team" for flag -label: "team" is not key=value (see 'shizu rent -h')`},
		{"a missing value says so", []string{"nodes", "-o"},
			"shizu nodes: flag needs an argument: -o (see 'shizu nodes -h')"},
		{"a sub-command's flags too", []string{"pools", "apply", "-file", "x.json"},
			"shizu pools apply: flag provided but not defined: -file; did you mean -f? (see 'shizu pools apply -h')"},
		{"dev", []string{"dev", "-ephemral"},
			"shizu dev: flag provided but not defined: -ephemral; did you mean -ephemeral? (see 'shizu dev -h')"},
		{"provision", []string{"provision", "-replica", "3"},
			"shizu provision: flag provided but not defined: -replica; did you mean -replicas? (see 'shizu provision -h')"},
		{"bench", []string{"bench", "-onyl", "placement"},
			"shizu bench: flag provided but not defined: -onyl; did you mean -only? (see 'shizu bench -h')"},
		{"replay", []string{"replay", "-polices", "fgd"},
			"shizu replay: flag provided but not defined: -polices; did you mean -policies? (see 'shizu replay -h')"},
		{"a bad value the verb checks has the hint too", []string{"rent", "-gpus", "0"},
			"shizu rent: -gpus 0: want 1..64 (all on one node) (see 'shizu rent -h')"},
		{"a mistyped command is guessed", []string{"rnet"},
			`shizu: unknown command "rnet"; did you mean rent? (see 'shizu help')`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var out, errOut bytes.Buffer
			code := run(t.Context(), c.args, &out, &errOut)
			if got := strings.TrimSuffix(errOut.String(), "\n"); code != 2 || got != c.want || out.Len() != 0 {
				t.Fatalf("exit %d, stdout %q, stderr\n%s\nwant exit 2, no stdout, stderr\n%s", code, out.String(), errOut.String(), c.want)
			}
		})
	}
}

// TestHelpStillPrintsTheWholeUsage: -h is not a mistake: the usage with
// its flags, exit 0.
func TestHelpStillPrintsTheWholeUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"rent", "-h"}, {"pools", "apply", "-h"}, {"dev", "-h"}, {"provision", "-h"}, {"bench", "-h"}, {"replay", "-h"}} {
		var out, errOut bytes.Buffer
		if code := run(t.Context(), args, &out, &errOut); code != 0 || !strings.Contains(errOut.String(), "-h") && !strings.Contains(errOut.String(), "Flags:") {
			t.Errorf("%v: exit %d, stderr %q; want exit 0 and the usage", args, code, errOut.String())
		}
		if lines := strings.Count(errOut.String(), "\n"); lines < 5 {
			t.Errorf("%v: %d lines of help, want the whole usage:\n%s", args, lines, errOut.String())
		}
	}
}

func TestClosestFlag(t *testing.T) {
	t.Parallel()
	words := []string{"gpus", "gpu", "o", "output", "active", "all-tenants"}
	for w, want := range map[string]string{"gpuz": "gpus", "gpu": "gpu", "ac": "active", "all": "all-tenants", "qqqqqq": "", "outptu": "output"} {
		if got := closest(w, words); got != want {
			t.Errorf("closest(%q) = %q, want %q", w, got, want)
		}
	}
}
