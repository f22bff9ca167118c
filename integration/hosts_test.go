package integration

import (
	"strings"
	"testing"
)

// Every sandbox has an /etc/hosts, as a container under Docker or
// Kubernetes does: localhost resolves with no network at all (a dev
// server dialled as localhost, noVNC's proxy), and so does the
// sandbox's own hostname; a fork resolves its own, not its parent's.
func TestHostsFile(t *testing.T) {
	e := newEnv(t)
	e.root = baseArchive(t)
	id := e.create("--image", "base")
	t.Cleanup(func() { e.run(nil, "rm", "-f", id) })
	resolve := `import socket; print(socket.gethostname(), socket.gethostbyname("localhost"), socket.gethostbyname(socket.gethostname()), socket.getaddrinfo("localhost", 80, socket.AF_INET6)[0][4][0])`
	out := strings.TrimSpace(e.ok("exec", id, "--", "python3", "-c", resolve))
	want := id[:12] + " 127.0.0.1 127.0.1.1 ::1"
	if out != want {
		t.Fatalf("in the sandbox: %q, want %q", out, want)
	}
	// A server on localhost answers a client that dials the name.
	e.ok("exec", "-d", id, "--", "python3", "-m", "http.server", "-b", "127.0.0.1", "8000")
	waitFor(t, func() bool {
		return e.run(nil, "exec", id, "--", "curl", "-fsS", "-o", "/dev/null", "http://localhost:8000/").code == 0
	})
	if r := e.run(nil, "exec", id, "--", "sh", "-c", "echo x >> /etc/hosts"); r.code == 0 {
		t.Errorf("the sandbox's user wrote its /etc/hosts")
	}

	forks := strings.Fields(e.ok("fork", id))
	if len(forks) != 1 {
		t.Fatalf("fork: %q", forks)
	}
	t.Cleanup(func() { e.run(nil, "rm", "-f", forks[0]) })
	out = strings.TrimSpace(e.ok("exec", forks[0], "--", "python3", "-c", resolve))
	if want := forks[0][:12] + " 127.0.0.1 127.0.1.1 ::1"; out != want {
		t.Fatalf("in the fork: %q, want %q", out, want)
	}
}
