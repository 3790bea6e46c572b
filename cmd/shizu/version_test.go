package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionNamesTheReleaseAndTheCommit(t *testing.T) {
	t.Parallel()
	info := &debug.BuildInfo{GoVersion: "go1.26.8", Settings: []debug.BuildSetting{
		{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "1583d7d1a2b3c4d5e6f708192a3b4c5d6e7f8091"},
		{Key: "vcs.time", Value: "2026-12-04T19:00:00Z"}, {Key: "vcs.modified", Value: "true"}}}
	b := buildInfoOf("v0.4.0", "", false, info, true)
	if b.Release != "v0.4.0" || b.Commit != "1583d7d1a2b3c4d5e6f708192a3b4c5d6e7f8091" || !b.Modified || b.Go != "go1.26.8" {
		t.Fatalf("build info %+v", b)
	}
	if got := b.String(); !strings.HasPrefix(got, "shizu v0.4.0 (commit 1583d7d1a2b3, 2026-12-04T19:00:00Z, with uncommitted changes; go1.26.8 ") {
		t.Fatalf("line %q", got)
	}
	// go run and -buildvcs=false stamp no commit: the line says so.
	if got := buildInfoOf("dev", "", false, &debug.BuildInfo{}, true).String(); !strings.HasPrefix(got, "shizu dev (commit unknown: built without VCS stamping") {
		t.Fatalf("line without VCS settings %q", got)
	}
	if b := buildInfoOf("dev", "", false, nil, false); b.Release != "dev" || b.Commit != "" || b.Go == "" {
		t.Fatalf("no build info: %+v", b)
	}
	// A build script's commit stands where go build stamped none, and the
	// stamped one wins over it.
	if b := buildInfoOf("dev", "abc123", true, &debug.BuildInfo{}, true); b.Commit != "abc123" || !b.Modified {
		t.Fatalf("script's commit: %+v", b)
	}
	if b := buildInfoOf("dev", "abc123", false, info, true); b.Commit != "1583d7d1a2b3c4d5e6f708192a3b4c5d6e7f8091" {
		t.Fatalf("stamped commit: %+v", b)
	}
}

func TestVersionRefusesStrayArguments(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	if code := run(t.Context(), []string{"version", "now"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), `unexpected argument "now"`) {
		t.Fatalf("exit %d, stderr %q", code, errOut.String())
	}
}

// gitHead is the checkout's HEAD and whether its .git is a folder (go
// build stamps VCS settings only then: not in a git worktree); the test
// skips outside a git checkout.
func gitHead(t *testing.T) (head string, stamps bool) {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "HEAD", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not a git checkout (git rev-parse HEAD: %v): there is no commit to name", err)
	}
	lines := strings.Fields(string(out))
	fi, err := os.Stat(filepath.Join(lines[1], ".git"))
	return lines[0], err == nil && fi.IsDir()
}

// checkVersion runs bin's `version` and `version -json` and checks they
// name release and commit.
func checkVersion(t *testing.T, bin, release, commit string) {
	t.Helper()
	out, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.HasPrefix(string(out), "shizu "+release+" (commit "+commit[:12]) {
		t.Fatalf("shizu version: %q (%v), want release %s and commit %s", out, err, release, commit[:12])
	}
	out, err = exec.Command(bin, "version", "-json").Output()
	var b buildInfo
	if err != nil || json.Unmarshal(out, &b) != nil || b.Release != release || b.Commit != commit {
		t.Fatalf("shizu version -json: %s (%v), want release %s and commit %s", out, err, release, commit)
	}
}

// TestTheDevScriptBuildsQuietlyAndNamesItsCommit runs the README's first
// command's build step (scripts/dev.sh --build-only): it says it is
// building, prints no compiler warning, and the binary names the release
// it was given and the checkout's HEAD, also in a git worktree.
func TestTheDevScriptBuildsQuietlyAndNamesItsCommit(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	head, _ := gitHead(t)
	bin := filepath.Join(t.TempDir(), "shizu")
	cmd := exec.Command("sh", filepath.Join("..", "..", "scripts", "dev.sh"), "--build-only")
	cmd.Env = append(os.Environ(), "SHIZU_BIN="+bin, "SHIZU_RELEASE=v9.8.7-test")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("scripts/dev.sh --build-only: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	if !strings.HasPrefix(stderr.String(), "building shizu into ") || strings.Contains(strings.ToLower(stderr.String()), "warning") {
		t.Fatalf("stderr %q: want the building line and no warning", stderr.String())
	}
	checkVersion(t, bin, "v9.8.7-test", head)
}

// TestABuiltBinaryNamesTheCommitGoBuildStamps: a plain go build of a
// release in a clone (not a worktree) names the commit from the VCS
// settings go build stamps. -buildvcs=true wins over a
// GOFLAGS=-buildvcs=false of the machine.
func TestABuiltBinaryNamesTheCommitGoBuildStamps(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	head, stamps := gitHead(t)
	if !stamps {
		t.Skip("a git worktree (.git is a file): go build stamps no VCS settings here; scripts/dev.sh names the commit instead")
	}
	bin := filepath.Join(t.TempDir(), "shizu")
	build := exec.Command("go", "build", "-buildvcs=true", "-ldflags", "-X main.release=v9.8.7-test", "-o", bin, ".")
	build.Env = append(build.Environ(), "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	checkVersion(t, bin, "v9.8.7-test", head)
}
