package engine

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A spool passes its input through unchanged, lets the writer finish
// while the reader has not started, and stays within maxAhead.
func TestSpool(t *testing.T) {
	data := make([]byte, 40<<20+12345)
	rand.Read(data)

	// The writer finishes long before the reader reads anything.
	pr, pw := io.Pipe()
	wrote := make(chan struct{})
	go func() {
		for b := data; len(b) > 0; {
			n := min(len(b), 70000)
			pw.Write(b[:n])
			b = b[n:]
		}
		pw.Close()
		close(wrote)
	}()
	s, err := newSpool(t.TempDir(), pr, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-wrote:
	case <-time.After(30 * time.Second):
		t.Fatal("the writer could not finish before the reader started")
	}
	var got bytes.Buffer
	buf := make([]byte, 3<<20+7)
	if _, err := io.CopyBuffer(&got, s, buf); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("%d bytes out of %d in, not the same", got.Len(), len(data))
	}
	s.Close()

	// maxAhead holds the writer back, and the file's blocks stay near it.
	pr, pw = io.Pipe()
	go func() {
		for b := data; len(b) > 0; {
			n, err := pw.Write(b[:min(len(b), 1<<20)])
			if err != nil {
				return
			}
			b = b[n:]
		}
		pw.Close()
	}()
	s, err = newSpool(t.TempDir(), pr, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	got.Reset()
	for {
		time.Sleep(time.Millisecond)
		n, err := s.Read(buf[:1<<20])
		got.Write(buf[:n])
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(s.f.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		s.mu.Lock()
		ahead := s.written - s.read
		s.mu.Unlock()
		if ahead > 4<<20 {
			t.Fatalf("%d bytes ahead of the reader, at most %d allowed", ahead, 4<<20)
		}
		if held := st.Blocks * 512; held > 4<<20+spoolPunch+(1<<20) {
			t.Fatalf("the spool holds %d bytes on disk", held)
		}
	}
	if !bytes.Equal(got.Bytes(), data) {
		t.Fatal("data changed through a spool that held the writer back")
	}
	s.Close()

	// The writer's error reaches the reader after what came before it.
	pr, pw = io.Pipe()
	go func() {
		pw.Write(data[:1000])
		pw.CloseWithError(os.ErrDeadlineExceeded)
	}()
	s, err = newSpool(t.TempDir(), pr, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(s)
	if len(b) != 1000 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%d bytes, %v", len(b), err)
	}
	// Closed, it reads nothing more; a writer still writing is not
	// waited for.
	pr, pw = io.Pipe()
	s, err = newSpool(t.TempDir(), pr, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	pr.Close()
	if _, err := s.Read(buf); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("read after close: %v", err)
	}
}
