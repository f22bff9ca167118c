package engine

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func TestSupervisorRunsc(t *testing.T) {
	e, id := runscEngine(t)
	ctx := context.Background()
	sv, err := e.Supervisor(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer sv.Close()

	t.Run("pid, output, status", func(t *testing.T) {
		var out, errOut syncBuffer
		p, err := sv.Start(ctx, ExecRequest{Args: []string{"sh", "-c", "echo $$; echo oops >&2; exit 5"}, Stdout: &out, Stderr: &errOut}, []byte("m1"))
		if err != nil {
			t.Fatal(err)
		}
		code, err := p.Wait()
		if code != 5 || err != nil {
			t.Fatalf("status %d, %v; want 5", code, err)
		}
		if got := strings.TrimSpace(out.String()); p.Pid() == 0 || got != strconv.Itoa(p.Pid()) {
			t.Fatalf("Pid() %d, the shell says its PID is %q", p.Pid(), got)
		}
		if errOut.String() != "oops\n" {
			t.Fatalf("stderr %q", errOut.String())
		}
		if err := p.Signal(syscall.SIGTERM); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("signal after the end: %v, want not found", err)
		}
		// The init remembers how it ended.
		ps, err := sv.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if sp := findProc(ps, p.Pid()); sp == nil || sp.Running || sp.ExitCode != 5 || string(sp.Meta) != "m1" {
			t.Fatalf("list: %+v", sp)
		}
	})

	t.Run("environment, directory, user", func(t *testing.T) {
		var out syncBuffer
		p, err := sv.Start(ctx, ExecRequest{Args: []string{"sh", "-c", `echo "$GREETING $(pwd) $(id -u):$(id -g)"`}, Env: []string{"GREETING=hi"}, Workdir: "/tmp", User: "65534:65533", Stdout: &out}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if code, err := p.Wait(); code != 0 || err != nil || out.String() != "hi /tmp 65534:65533\n" {
			t.Fatalf("status %d, %v, output %q", code, err, out.String())
		}
	})

	t.Run("not found, not executable", func(t *testing.T) {
		p, err := sv.Start(ctx, ExecRequest{Args: []string{"no-such-command"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if code, err := p.Wait(); code != ExitNotFound || err != nil || p.Pid() != 0 {
			t.Fatalf("status %d, %v, pid %d; want 127 and no PID", code, err, p.Pid())
		}
		p, err = sv.Start(ctx, ExecRequest{Args: []string{"/etc/passwd"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if code, err := p.Wait(); code != ExitNotExecutable || err != nil {
			t.Fatalf("status %d, %v; want 126", code, err)
		}
	})

	t.Run("input and signal", func(t *testing.T) {
		r, w := io.Pipe()
		var out syncBuffer
		p, err := sv.Start(ctx, ExecRequest{Args: []string{"sh", "-c", "while read x; do echo got $x; done; echo eof; sleep 600"}, Stdin: r, Stdout: &out}, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, "hello\n")
		waitFor(t, "the command reads its input", func() bool { return out.String() == "got hello\n" })
		w.Close()
		waitFor(t, "the command sees the end of its input", func() bool { return out.String() == "got hello\neof\n" })
		if err := p.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code, err := p.Wait(); code != 128+int(syscall.SIGTERM) || err != nil {
			t.Fatalf("status %d, %v; want 143", code, err)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		p, err := sv.Start(ctx, ExecRequest{Args: []string{"sleep", "600"}, Timeout: 200 * time.Millisecond}, nil)
		if err != nil {
			t.Fatal(err)
		}
		code, err := p.Wait()
		if code != ExitTimeout || !errors.Is(err, ErrTimeout) {
			t.Fatalf("status %d, %v; want 124", code, err)
		}
	})

	t.Run("on a terminal of the sandbox's own", func(t *testing.T) {
		var out syncBuffer
		p, err := sv.Start(ctx, ExecRequest{Args: []string{"sh", "-c", "tty; exit 3"}, TTY: true, Stdout: &out}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if code, err := p.Wait(); code != 3 || err != nil {
			t.Fatalf("status %d, %v; want 3", code, err)
		}
		if !strings.Contains(out.String(), "/dev/pts/") {
			t.Fatalf("tty printed %q, want a /dev/pts/N of the sandbox", out.String())
		}
	})

	t.Run("20 at once", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 20)
		for i := 0; i < 20; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var out syncBuffer
				p, err := sv.Start(ctx, ExecRequest{Args: []string{"sh", "-c", fmt.Sprintf("sleep 0.2; echo %d", i)}, Stdout: &out}, nil)
				if err != nil {
					errs <- err
					return
				}
				if code, err := p.Wait(); code != 0 || err != nil || out.String() != fmt.Sprintf("%d\n", i) {
					errs <- fmt.Errorf("command %d: status %d, %v, output %q", i, code, err, out.String())
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})

	t.Run("output nobody reads does not block", func(t *testing.T) {
		sv2, err := e.Supervisor(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		p, err := sv2.Start(ctx, ExecRequest{Args: []string{"sh", "-c", "sleep 0.3; head -c 10485760 /dev/zero; echo done >&2"}, Stdout: io.Discard}, nil)
		if err != nil {
			t.Fatal(err)
		}
		pid := p.Pid()
		sv2.Close()
		if code, err := p.Wait(); code != -1 || !errors.Is(err, ErrDetached) {
			t.Fatalf("wait after close: %d, %v; want ErrDetached", code, err)
		}
		waitFor(t, "the detached writer finishes", func() bool {
			ps, err := sv.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			sp := findProc(ps, pid)
			return sp != nil && !sp.Running && sp.ExitCode == 0
		})
	})

	t.Run("a client that is not root", func(t *testing.T) {
		nobody, err := e.Supervisor(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		defer nobody.Close()
		nobody.sessionUser = "65534:65534"
		var out syncBuffer
		p, err := nobody.Start(ctx, ExecRequest{Args: []string{"id", "-u"}, User: "0:0", Stdout: &out}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if code, err := p.Wait(); code != 0 || err != nil || out.String() != "65534\n" {
			t.Fatalf("a command asked for as root by uid 65534: status %d, %v, id -u %q; want 65534", code, err, out.String())
		}
		// Root's processes are not its to see or touch.
		rootCmd, err := sv.Start(ctx, ExecRequest{Args: []string{"sleep", "600"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer rootCmd.Signal(syscall.SIGKILL) //nolint:errcheck
		ps, err := nobody.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if findProc(ps, rootCmd.Pid()) != nil {
			t.Fatalf("uid 65534 lists root's process %d", rootCmd.Pid())
		}
		if _, err := nobody.Attach(ctx, rootCmd.Pid(), AttachRequest{}); !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Fatalf("uid 65534 attaches to root's process: %v", err)
		}
		if err := nobody.signal(rootCmd.Pid(), syscall.SIGKILL); !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Fatalf("uid 65534 kills root's process: %v", err)
		}
	})
}

func findProc(ps []SupervisedProcess, pid int) *SupervisedProcess {
	for i := range ps {
		if ps[i].Pid == pid {
			return &ps[i]
		}
	}
	return nil
}

// Supervised commands survive pause and resume: a loop goes on ticking
// and a server goes on answering.
func TestSupervisorPauseResumeRunsc(t *testing.T) {
	e, id := runscEngine(t)
	ctx := context.Background()
	sv, err := e.Supervisor(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var ticks syncBuffer
	ticker, err := sv.Start(ctx, ExecRequest{Args: []string{"sh", "-c", "while true; do echo tick; sleep 0.2; done"}, Stdout: &ticks}, []byte("ticker"))
	if err != nil {
		t.Fatal(err)
	}
	httpd, err := sv.Start(ctx, ExecRequest{Args: []string{"sh", "-c", "mkdir -p /tmp/www && echo hello-httpd > /tmp/www/index.html && exec busybox httpd -f -p 8080 -h /tmp/www"}}, []byte("httpd"))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "ticks", func() bool { return strings.Count(ticks.String(), "tick") >= 2 })
	get := func() (string, error) {
		d, err := e.PortDialer(ctx, id)
		if err != nil {
			return "", err
		}
		defer d.Close()
		c := &http.Client{Transport: &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return d.Dial(8080) }}, Timeout: 5 * time.Second}
		resp, err := c.Get("http://sandbox/index.html")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	var body string
	waitFor(t, "httpd answers", func() bool { body, err = get(); return err == nil })
	if body != "hello-httpd\n" {
		t.Fatalf("httpd: %q", body)
	}

	// The session dies with the pause; the next request starts another.
	if _, err := e.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := ticker.Wait(); !errors.Is(err, ErrDetached) {
		t.Fatalf("the first session's command after pause: %v, want detached", err)
	}

	defer sv.Close()
	ps, err := sv.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		pid  int
		meta string
	}{{ticker.Pid(), "ticker"}, {httpd.Pid(), "httpd"}} {
		if sp := findProc(ps, want.pid); sp == nil || !sp.Running || string(sp.Meta) != want.meta {
			t.Fatalf("after resume, process %d (%s): %+v in %+v", want.pid, want.meta, sp, ps)
		}
	}
	pr, pw := io.Pipe()
	p, err := sv.Attach(ctx, ticker.Pid(), AttachRequest{Stdout: pw})
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil || line != "tick\n" {
		t.Fatalf("re-attached: %q, %v", line, err)
	}
	go io.Copy(io.Discard, pr)
	if body, err := get(); err != nil || body != "hello-httpd\n" {
		t.Fatalf("httpd after resume: %q, %v", body, err)
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(); code != 128+int(syscall.SIGKILL) || err != nil {
		t.Fatalf("re-attached command killed: %d, %v", code, err)
	}
	// An attach to a process that has ended gives its status at once.
	again, err := sv.Attach(ctx, ticker.Pid(), AttachRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if code, err := again.Wait(); code != 128+int(syscall.SIGKILL) || err != nil {
		t.Fatalf("attach after the end: %d, %v", code, err)
	}
	if _, err := sv.Attach(ctx, 99999, AttachRequest{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("attach to no process: %v", err)
	}
}
