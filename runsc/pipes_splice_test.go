package runsc

import (
	"bytes"
	"io"
	"os"
	"syscall"
	"testing"
	"time"
)

// A caller's pipe gets every byte, in order, and its end once the
// process's copies are closed.
func TestPipesIntoCallersPipe(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p, err := NewPipes(nil, w, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.Start()
	want := make([]byte, 16<<20)
	for i := range want {
		want[i] = byte(i / 4093)
	}
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(r)
		got <- b
	}()
	go func() {
		p.Child[1].Write(want)
		p.CloseChild()
	}()
	p.Finish(10 * time.Second)
	w.Close()
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("the caller's pipe got %d bytes, not the %d written", len(b), len(want))
	}
}

// A caller that never reads its full pipe does not hold Finish up for
// ever, nor does output that a background child keeps open.
func TestPipesIntoStuckPipe(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	p, err := NewPipes(nil, w, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.Start()
	held, err := syscall.Dup(int(p.Child[1].Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(held)
	// More than both pipes hold: some stays in the process's.
	go p.Child[1].Write(make([]byte, 4*pipeSize()))
	time.Sleep(200 * time.Millisecond)
	done := make(chan struct{})
	go func() {
		p.Finish(100 * time.Millisecond)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(stuckDrain + 20*time.Second):
		t.Fatal("Finish waited for a caller that never reads")
	}
	p.CloseChild()
}
