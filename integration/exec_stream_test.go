package integration

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// streamScript writes seq 1 N to stdout and seq N+1 N+M to stderr, in
// alternating chunks (stdout's last), then exits 3: each stream's every
// line, in order, tells a lost, cut or interleaved byte.
const (
	streamLines = 400000 // about 2.7 MB: more than the pipes on the way hold
	streamErrs  = 20000
	streamExit  = 3
)

var streamScript = fmt.Sprintf(`i=1; j=%d
while [ $i -le %d ]; do
	seq $j $((j+4999)) >&2
	seq $i $((i+99999))
	i=$((i+100000)); j=$((j+5000))
done
exit %d`, streamLines+1, streamLines, streamExit)

func seqText(from, to int) string {
	var b strings.Builder
	for i := from; i <= to; i++ {
		fmt.Fprintf(&b, "%d\n", i)
	}
	return b.String()
}

// checkStream compares what a stream received with what was written,
// naming the first difference.
func checkStream(t *testing.T, name, got, want string) {
	t.Helper()
	if got == want {
		return
	}
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	t.Errorf("%s: got %d bytes, want %d; first difference at byte %d: got %q, want %q",
		name, len(got), len(want), i, got[i:min(i+20, len(got))], want[i:min(i+20, len(want))])
}

// The output of `hutch exec` is all in its stdout and stderr, each in
// order and neither mixed into the other, by the time hutch exits with the
// command's status: whether stdout is a file or a pipe that the caller
// only starts to read late (the output is still on its way when the
// command exits).
func TestExecStreamCompleteAtExit(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	wantOut, wantErr := seqText(1, streamLines), seqText(streamLines+1, streamLines+streamErrs)
	dir := t.TempDir()

	t.Run("file", func(t *testing.T) {
		out, err := os.Create(filepath.Join(dir, "out"))
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		// Output appended after what the file already holds.
		fmt.Fprintln(out, "before")
		errf, err := os.Create(filepath.Join(dir, "err"))
		if err != nil {
			t.Fatal(err)
		}
		defer errf.Close()
		c := e.cmd(nil, "exec", id, "--", "sh", "-c", streamScript)
		c.Stdout, c.Stderr = out, errf
		err = c.Run()
		if c.ProcessState == nil || c.ProcessState.ExitCode() != streamExit {
			t.Fatalf("hutch exec: %v, want exit status %d", err, streamExit)
		}
		// Read at once: nothing may arrive after hutch has exited.
		gotOut, _ := os.ReadFile(out.Name())
		gotErr, _ := os.ReadFile(errf.Name())
		checkStream(t, "stdout in a file", string(gotOut), "before\n"+wantOut)
		checkStream(t, "stderr in a file", string(gotErr), wantErr)
		// And nothing later either.
		time.Sleep(time.Second)
		if st, err := os.Stat(out.Name()); err != nil || st.Size() != int64(len(gotOut)) {
			t.Errorf("stdout's file changed after hutch exited: %v", err)
		}
	})

	t.Run("pipe", func(t *testing.T) {
		outR, outW, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer outR.Close()
		errR, errW, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer errR.Close()
		c := e.cmd(nil, "exec", id, "--", "sh", "-c", streamScript)
		c.Stdout, c.Stderr = outW, errW
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		outW.Close()
		errW.Close()
		type read struct {
			b   []byte
			err error
		}
		gotErr := make(chan read, 1)
		go func() {
			b, err := io.ReadAll(errR)
			gotErr <- read{b, err}
		}()
		// The command fills the pipes and waits before stdout's reader
		// comes, and then reads slowly: when the command exits, the
		// pipes on the way are full.
		time.Sleep(2 * time.Second)
		var gotOut bytes.Buffer
		readOut := make(chan error, 1)
		go func() {
			buf := make([]byte, 16<<10)
			for {
				n, err := outR.Read(buf)
				gotOut.Write(buf[:n])
				if err == io.EOF {
					err = nil
				}
				if err != nil || n == 0 {
					readOut <- err
					return
				}
				time.Sleep(2 * time.Millisecond)
			}
		}()
		err = c.Wait()
		if c.ProcessState.ExitCode() != streamExit {
			t.Fatalf("hutch exec: %v, want exit status %d", err, streamExit)
		}
		// hutch has exited: the pipes hold the rest and then end, with
		// no writer left behind.
		for _, f := range []*os.File{outR, errR} {
			f.SetReadDeadline(time.Now().Add(5 * time.Second))
		}
		if err := <-readOut; err != nil {
			t.Fatalf("stdout's pipe did not end with hutch: %v", err)
		}
		r := <-gotErr
		if r.err != nil {
			t.Fatalf("stderr's pipe did not end with hutch: %v", r.err)
		}
		checkStream(t, "stdout in a pipe", gotOut.String(), wantOut)
		checkStream(t, "stderr in a pipe", string(r.b), wantErr)
	})
}
