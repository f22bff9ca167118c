package overlay

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// fileLock is a held flock(2) lock. Locks are per open file description, so
// they exclude other goroutines of this process as well as other processes.
type fileLock struct {
	f *os.File
}

// lockPath takes a flock of kind how (unix.LOCK_SH or unix.LOCK_EX) on path,
// creating the file if needed, and blocks until it is granted.
func lockPath(path string, how int) (*fileLock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return &fileLock{f: f}, nil
}

// Unlock releases the lock.
func (l *fileLock) Unlock() {
	if l != nil && l.f != nil {
		l.f.Close() // closing the last descriptor drops the flock
		l.f = nil
	}
}
