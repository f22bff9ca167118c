package engine

import (
	"errors"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// spool reads r ahead of its own reader into an unlinked file, up to
// maxAhead bytes ahead. A snapshot reads the sandbox's export through one:
// the sandbox holds its filesystem's lock while it exports, and with the
// spool it finishes at the speed the file takes the data, not at the
// speed the store hashes and writes it (docs/decisions/0030). What has
// been read is punched out of the file as the reader goes, so the file
// holds at most about maxAhead bytes on the host.
type spool struct {
	f        *os.File
	maxAhead int64

	mu   sync.Mutex
	cond *sync.Cond
	// written is how much of r the file holds, read how much of that
	// has been read, punched how much of that has been punched out.
	written, read, punched int64
	// done: r has ended, with err (nil at its end of file).
	done   bool
	err    error
	closed bool
}

// spoolPunch is how much is read between two punches.
const spoolPunch = 16 << 20

// newSpool starts reading r into an unlinked file in dir.
func newSpool(dir string, r io.Reader, maxAhead int64) (*spool, error) {
	f, err := os.OpenFile(dir, os.O_RDWR|unix.O_TMPFILE, 0o600)
	if err != nil {
		// A filesystem without O_TMPFILE.
		if f, err = os.CreateTemp(dir, ".spool-"); err != nil {
			return nil, err
		}
		os.Remove(f.Name())
	}
	s := &spool{f: f, maxAhead: max(maxAhead, 1<<20)}
	s.cond = sync.NewCond(&s.mu)
	go s.fill(r)
	return s, nil
}

func (s *spool) fill(r io.Reader) {
	buf := make([]byte, 1<<20)
	for {
		s.mu.Lock()
		for s.written-s.read >= s.maxAhead && !s.closed {
			s.cond.Wait()
		}
		closed, off := s.closed, s.written
		s.mu.Unlock()
		if closed {
			return
		}
		n, err := r.Read(buf[:min(int64(len(buf)), s.maxAhead)])
		if n > 0 {
			if _, werr := s.f.WriteAt(buf[:n], off); werr != nil {
				n, err = 0, werr
			}
		}
		s.mu.Lock()
		s.written += int64(n)
		if err != nil {
			s.done = true
			if !errors.Is(err, io.EOF) {
				s.err = err
			}
		}
		s.cond.Broadcast()
		s.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// Read reads what the file holds, waiting for more while r has not ended.
func (s *spool) Read(p []byte) (int, error) {
	s.mu.Lock()
	for s.read == s.written && !s.done && !s.closed {
		s.cond.Wait()
	}
	if s.closed {
		s.mu.Unlock()
		return 0, os.ErrClosed
	}
	avail, off := s.written-s.read, s.read
	if avail == 0 {
		err := s.err
		s.mu.Unlock()
		if err == nil {
			err = io.EOF
		}
		return 0, err
	}
	s.mu.Unlock()
	n, err := s.f.ReadAt(p[:min(int64(len(p)), avail)], off)
	s.mu.Lock()
	s.read += int64(n)
	if s.read-s.punched >= spoolPunch {
		// Whole pages only; the rest goes with the next punch.
		end := s.read &^ (4096 - 1)
		unix.Fallocate(int(s.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, s.punched, end-s.punched) //nolint:errcheck // only space
		s.punched = end
	}
	s.cond.Broadcast()
	s.mu.Unlock()
	if n > 0 && errors.Is(err, io.EOF) {
		err = nil
	}
	return n, err
}

// Close ends the spool and removes its file. The caller also ends r, if
// it has not ended, for fill to return.
func (s *spool) Close() error {
	s.mu.Lock()
	s.closed = true
	s.cond.Broadcast()
	s.mu.Unlock()
	return s.f.Close()
}
