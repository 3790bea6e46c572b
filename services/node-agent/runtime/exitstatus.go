package runtime

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// A workload runs under a small shell that waits for it and writes its
// exit status to a file before exiting itself: an agent that adopts a
// workload after a restart is not its parent and cannot wait for it, so
// without the file it could only say the workload ended, not how. The
// shell catches SIGTERM, SIGINT and SIGHUP (the workload gets them as the
// process group does, with their default dispositions, since a caught
// signal is reset on exec) so that it outlives a polite stop and records
// how it went; a SIGKILL of the group takes it too, and then there is no
// file. The status is the shell's $?: 128+n when the workload was killed
// by signal n, as shells, Docker and Kubernetes report it.
const statusShell = `f=$1; shift
trap : TERM INT HUP
"$@"
c=$?
echo "$c" >"$f"
exit "$c"`

// wrapped is the command that runs argv under the status shell, which
// writes argv's exit status to statusPath. argv[0] is resolved first, so
// a command that does not exist still fails the start instead of
// starting a shell that exits 127.
func wrapped(argv []string, statusPath string) (*exec.Cmd, error) {
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return nil, fmt.Errorf("start workload: %w", err)
	}
	args := append([]string{"-c", statusShell, "shizu-workload", statusPath, path}, argv[1:]...)
	return exec.Command("/bin/sh", args...), nil
}

// fromStatusFile is how the workload of rec ended, by the status its shell
// wrote; false when there is none (the shell was killed too, or the
// record is from before status files).
func (p *Process) fromStatusFile(rec record, w Workload) (Exit, bool) {
	if rec.StatusPath == "" {
		return Exit{}, false
	}
	b, err := os.ReadFile(rec.StatusPath)
	if err != nil {
		return Exit{}, false
	}
	code, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return Exit{}, false
	}
	x := Exit{Workload: w, StoppedAt: p.stoppedAt(rec), ExitCode: code}
	if sig := code - 128; sig > 0 && sig < 65 {
		x.ExitCode, x.Detail = -1, "killed by "+signalName(syscall.Signal(sig))
	}
	return x, true
}
