package runsc

import (
	"bytes"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The process side is played here by the test itself, on the real pipes.
func TestPipesCarryStdio(t *testing.T) {
	var out, errb bytes.Buffer
	p, err := NewPipes(strings.NewReader("to stdin"), &out, &errb)
	if err != nil {
		t.Fatal(err)
	}
	p.Start()
	in, err := io.ReadAll(p.Child[0])
	if err != nil || string(in) != "to stdin" {
		t.Fatalf("the process read %q, %v", in, err)
	}
	p.Child[1].WriteString("to stdout")
	p.Child[2].WriteString("to stderr")
	p.CloseChild()
	p.Finish(10 * time.Second)
	if out.String() != "to stdout" || errb.String() != "to stderr" {
		t.Fatalf("stdout %q, stderr %q", out.String(), errb.String())
	}
}

func TestPipesWithoutReaderOrWritersAreDevNull(t *testing.T) {
	p, err := NewPipes(nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i, f := range p.Child {
		var st, null syscall.Stat_t
		if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Stat(os.DevNull, &null); err != nil {
			t.Fatal(err)
		}
		if st.Rdev != null.Rdev {
			t.Errorf("stdio %d is not /dev/null", i)
		}
	}
}

// A background child that keeps the output open does not hold Finish up
// past its drain time.
func TestPipesFinishStopsAfterDrain(t *testing.T) {
	var out bytes.Buffer
	p, err := NewPipes(nil, &out, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.Start()
	held, err := syscall.Dup(int(p.Child[1].Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(held)
	p.Child[1].WriteString("early")
	p.CloseChild()
	done := make(chan struct{})
	go func() {
		p.Finish(100 * time.Millisecond)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Finish waited for an output a child still holds")
	}
}

// An interactive process's answers reach the caller as they come: none
// waits for more output to gather, as a stream's small writes do.
func TestPipesInteractiveHoldsNothingBack(t *testing.T) {
	// Each answer is read before the next is written, as a session's
	// are: a held-back copy shows as the time they take.
	const answers = 20
	roundTrips := func(interactive bool) time.Duration {
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
		p.Interactive = interactive
		p.Start()
		defer p.Finish(time.Second)
		defer p.CloseChild()
		start := time.Now()
		buf := make([]byte, 1)
		for i := 0; i < answers; i++ {
			if _, err := p.Child[1].Write([]byte{'x'}); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(r, buf); err != nil {
				t.Fatal(err)
			}
		}
		return time.Since(start)
	}
	streaming, interactive := roundTrips(false), roundTrips(true)
	// The streaming case is what Interactive turns off: if it no longer
	// batches, this test no longer tells anything.
	if streaming < answers*batchWait()/2 {
		t.Fatalf("streaming: %d answers took only %v: small writes are no longer gathered", answers, streaming)
	}
	if interactive >= streaming/2 {
		t.Errorf("interactive: %d answers took %v, streaming %v: they were held back", answers, interactive, streaming)
	}
}
