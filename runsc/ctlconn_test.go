package runsc

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/unet"
	"gvisor.dev/gvisor/pkg/urpc"
)

// ctlTest is a control server's object: Echo answers, Refuse refuses.
type ctlTest struct{}

func (*ctlTest) Echo(arg *int, r *int) error { *r = *arg; return nil }

func (*ctlTest) Refuse(arg *int, r *struct{}) error { return errors.New("refused") }

// ctlServer serves ctlTest on a socket as a sentry serves its control
// calls (urpc). It counts the connections it accepted and those it still
// serves: a sentry's shutdown waits for the last to end.
type ctlServer struct {
	path             string
	accepted, active atomic.Int32

	mu    sync.Mutex
	conns []*unet.Socket
}

func newCtlServer(t *testing.T) *ctlServer {
	c := &ctlServer{path: filepath.Join(t.TempDir(), "ctl")}
	ss, err := unet.BindAndListen(c.path, false)
	if err != nil {
		t.Fatal(err)
	}
	srv := urpc.NewServer()
	srv.Register(&ctlTest{})
	go func() {
		for {
			s, err := ss.Accept()
			if err != nil {
				return
			}
			c.accepted.Add(1)
			c.active.Add(1)
			c.mu.Lock()
			c.conns = append(c.conns, s)
			c.mu.Unlock()
			go func() {
				defer c.active.Add(-1)
				srv.Handle(s) //nolint:errcheck // ends with the connection
			}()
		}
	}()
	t.Cleanup(func() { ss.Close() })
	return c
}

// closeAll closes the server's end of every connection.
func (c *ctlServer) closeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.conns {
		s.Shutdown() //nolint:errcheck // the handler closes it
	}
}

// Calls in quick succession share one connection, a refusal included;
// calls at once each get an answer; a connection left idle is closed
// soon, so that it does not hold the sentry's shutdown.
func TestControlKeepsOneConnectionWhileBusy(t *testing.T) {
	srv := newCtlServer(t)
	ctl := NewControl(srv.path)
	ctx := context.Background()
	for i := range 20 {
		var r int
		if err := ctl.call(ctx, "ctlTest.Echo", &i, &r); err != nil || r != i {
			t.Fatalf("call %d: %d, %v", i, r, err)
		}
		var re urpc.RemoteError
		if err := ctl.call(ctx, "ctlTest.Refuse", &i, &struct{}{}); !errors.As(err, &re) || re.Message != "refused" {
			t.Fatalf("a refused call: %v", err)
		}
	}
	if n := srv.accepted.Load(); n != 1 {
		t.Errorf("40 calls one after another made %d connections, want 1", n)
	}

	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var r int
			if err := ctl.call(ctx, "ctlTest.Echo", &i, &r); err != nil || r != i {
				t.Errorf("concurrent call %d: %d, %v", i, r, err)
			}
		}()
	}
	wg.Wait()

	deadline := time.Now().Add(time.Second + ctlIdleTimeout)
	for srv.active.Load() != 0 && time.Now().Before(deadline) {
		time.Sleep(ctlIdleTimeout / 10)
	}
	if n := srv.active.Load(); n != 0 {
		t.Errorf("%d connections still open a second after the last call", n)
	}
}

// A call on a connection the server closed fails, and the next call
// connects again.
func TestControlAfterServerClosed(t *testing.T) {
	srv := newCtlServer(t)
	ctl := NewControl(srv.path)
	defer ctl.Close()
	ctx := context.Background()
	one := 1
	var r int
	if err := ctl.call(ctx, "ctlTest.Echo", &one, &r); err != nil {
		t.Fatal(err)
	}
	srv.closeAll()
	for srv.active.Load() != 0 {
		time.Sleep(time.Millisecond)
	}
	if err := ctl.call(ctx, "ctlTest.Echo", &one, &r); err == nil {
		t.Fatal("a call on a closed connection succeeded")
	}
	before := srv.accepted.Load()
	if err := ctl.call(ctx, "ctlTest.Echo", &one, &r); err != nil || r != 1 {
		t.Fatalf("the call after: %d, %v", r, err)
	}
	if srv.accepted.Load() != before+1 {
		t.Errorf("the call after a failed one did not connect again")
	}
}
