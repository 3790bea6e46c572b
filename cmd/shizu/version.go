package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// release names the release this binary is. A release build sets it:
//
//	go build -ldflags "-X main.release=v0.4.0" ./cmd/shizu
//
// Any other build is a development build of the commit it was built from.
var release = "dev"

// commit and modified name the commit a build script built from, and
// whether its tree had uncommitted changes ("true"), for builds that go
// build stamps with no VCS settings (a git worktree, whose .git is a
// file; -buildvcs=false): scripts/dev.sh sets them with
// -X main.commit=$(git rev-parse HEAD). The stamped settings win.
var commit, modified string

// buildInfo is what `shizu version` prints: the release, and the commit,
// its time and whether the tree had uncommitted changes, from the VCS
// settings `go build` stamps in a git checkout (`go run` and
// -buildvcs=false stamp none: the commit is then unknown).
type buildInfo struct {
	Release    string `json:"release"`
	Commit     string `json:"commit"`
	CommitTime string `json:"commit_time,omitempty"`
	Modified   bool   `json:"modified"`
	Go         string `json:"go"`
	Platform   string `json:"platform"`
}

// readBuildInfo is the build of this binary.
func readBuildInfo() buildInfo {
	info, ok := debug.ReadBuildInfo()
	return buildInfoOf(release, commit, modified == "true", info, ok)
}

// buildInfoOf is the build of release at commit (may be ""), with the VCS
// settings of info (none when !ok) taking precedence.
func buildInfoOf(release, commit string, modified bool, info *debug.BuildInfo, ok bool) buildInfo {
	b := buildInfo{Release: release, Commit: commit, Modified: modified, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if !ok || info == nil {
		return b
	}
	if info.GoVersion != "" {
		b.Go = info.GoVersion
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Commit = s.Value
		case "vcs.time":
			b.CommitTime = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

// String is the line `shizu version` prints:
// "shizu v0.4.0 (commit 1583d7d1a2b3, 2026-12-04T19:00:00Z; go1.26.8 linux/amd64)".
func (b buildInfo) String() string {
	at := "commit unknown: built without VCS stamping (go run, or -buildvcs=false; scripts/dev.sh names it)"
	if b.Commit != "" {
		at = "commit " + b.Commit[:min(12, len(b.Commit))]
		if b.CommitTime != "" {
			at += ", " + b.CommitTime
		}
		if b.Modified {
			at += ", with uncommitted changes"
		}
	}
	return fmt.Sprintf("shizu %s (%s; %s %s)", b.Release, at, b.Go, b.Platform)
}

func versionCommand(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("shizu version", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(stderr, `Print the release of this binary and the commit it was built from.

Examples:
  shizu version
  shizu version -json

Flags:
`)
		fs.PrintDefaults()
	}
	asJSON := fs.Bool("json", false, "print JSON (as -o json does)")
	output := fs.String("o", "table", "output: table (one line) or json")
	if err := parseFlags(fs, args, stderr); err != nil {
		return flagExit(err)
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "shizu version: unexpected argument %q %s\n", fs.Arg(0), helpHint("shizu version"))
		return exitUsage
	case *output != "table" && *output != "json":
		fmt.Fprintf(stderr, "shizu version: -o %q: want table or json %s\n", *output, helpHint("shizu version"))
		return exitUsage
	}
	b := readBuildInfo()
	if *asJSON || *output == "json" {
		if err := printJSON(stdout, b); err != nil {
			fmt.Fprintf(stderr, "shizu version: %v\n", err)
			return exitFail
		}
		return exitOK
	}
	fmt.Fprintln(stdout, b)
	return exitOK
}
