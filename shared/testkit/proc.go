package testkit

import (
	"fmt"
	"os/exec"
	"syscall"
	"time"
)

// serverProcess is a server run as a child process (NATSProcess,
// RedisProcess): started again on the same port after a kill, and
// SIGKILLed as a crash would end it.
type serverProcess struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// start runs newCmd until ready says the server serves, retrying for a
// while: after a kill the old listener may take a moment to free the port.
func (p *serverProcess) start(newCmd func() *exec.Cmd, ready func(exited <-chan struct{}) error) error {
	var last error
	for range 50 {
		cmd := newCmd()
		if err := cmd.Start(); err != nil {
			return err
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		p.cmd, p.exited = cmd, exited
		if last = ready(exited); last == nil {
			return nil
		}
		_ = cmd.Process.Kill()
		<-exited
		p.cmd = nil
		time.Sleep(100 * time.Millisecond)
	}
	return last
}

// running reports whether the process is alive.
func (p *serverProcess) running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// kill SIGKILLs the process (no shutdown: what a crash does) and reaps it.
func (p *serverProcess) kill() {
	if !p.running() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
	p.cmd = nil
}

// serving polls probe until it succeeds, the process exits or 15 s pass.
func serving(exited <-chan struct{}, probe func() error) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := probe()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("exited before serving: %w", err)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not serving within 15 s: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
