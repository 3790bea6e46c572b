package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// devLockName is the file in the data folder that one `shizu dev` holds an
// exclusive lock on for as long as it runs: two platforms on one folder
// would run two NATS servers on one JetStream store and two redis-servers
// on one AOF.
const devLockName = "lock"

// lockDataDir takes the data folder's lock, or says which process holds
// it. The lock is the kernel's (flock), so it ends with the process however
// that exits; the pid written into the file is only for the message.
func lockDataDir(dir string) (unlock func(), err error) {
	path := filepath.Join(dir, devLockName)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("data folder lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder := "another process"
		if b, rerr := os.ReadFile(path); rerr == nil {
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 {
				holder = "process " + strconv.Itoa(pid)
			}
		}
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("data folder %s is in use by another shizu dev (%s): stop it first, or pass -data with another folder (or -ephemeral)", dir, holder)
		}
		return nil, fmt.Errorf("data folder lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() {
		_ = f.Truncate(0)
		_ = f.Close() // closing the descriptor releases the lock
	}, nil
}
