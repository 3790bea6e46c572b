package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sync"
	"testing"
)

// builds are the binaries GoBuild made in this test binary's run, by
// package path.
var builds = struct {
	sync.Mutex
	done map[string]*build
}{done: map[string]*build{}}

type build struct {
	once sync.Once
	bin  string
	err  error
}

// GoBuild builds the main package pkg (an import path of the workspace or
// its dependencies, e.g. the node-agent's cmd) once per test binary run and
// returns the binary's path, for tests that run a real process of it: a
// service the package under test must not import, a server to SIGKILL.
// cgo stays on (go-nvml needs it), so a C compiler is needed as for the
// rest of the workspace.
func GoBuild(t testing.TB, pkg string) string {
	t.Helper()
	builds.Lock()
	b := builds.done[pkg]
	if b == nil {
		b = &build{}
		builds.done[pkg] = b
	}
	builds.Unlock()
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "shizu-testkit-build-")
		if err != nil {
			b.err = err
			return
		}
		b.bin = filepath.Join(dir, path.Base(pkg))
		cmd := exec.Command("go", "build", "-o", b.bin, pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s (needs cgo and a C compiler): %w\n%s", pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.bin
}
