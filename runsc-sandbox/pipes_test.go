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
