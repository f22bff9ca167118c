package agent

import (
	"net"
	"path/filepath"
	"testing"
	"time"
)

// A client that comes before the init has made its socket waits for it.
func TestDialInitWaitsForTheInit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock")
	listening := make(chan net.Listener, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		l, err := net.Listen("unix", path)
		if err != nil {
			t.Error(err)
		}
		listening <- l
	}()
	c, err := dialInit(path, 10*time.Second)
	if err != nil {
		t.Fatalf("dial before the init listens: %v", err)
	}
	c.Close()
	if l := <-listening; l != nil {
		l.Close()
	}
}

// With no init at all, the client gives up after its wait.
func TestDialInitGivesUp(t *testing.T) {
	start := time.Now()
	if c, err := dialInit(filepath.Join(t.TempDir(), "agent.sock"), 200*time.Millisecond); err == nil {
		c.Close()
		t.Fatal("dial with nothing listening succeeded")
	}
	if d := time.Since(start); d < 200*time.Millisecond || d > 5*time.Second {
		t.Fatalf("gave up after %s, want after about 200ms", d)
	}
}
