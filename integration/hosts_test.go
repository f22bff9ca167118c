package integration

import (
	"strings"
	"testing"
)

// Every sandbox has an /etc/hosts, as a container under Docker or
// Kubernetes does, even when its image carries none (base, like most
// images, has none): localhost resolves with no network at all, for a
// client that dials a dev server as localhost; root may change the file,
// as in a container; a fork has it too.
func TestHostsFile(t *testing.T) {
	e := newEnv(t)
	e.root = baseArchive(t)
	id := e.create("--image", "base")
	t.Cleanup(func() { e.run(nil, "rm", "-f", id) })
	resolve := `import socket; print(socket.gethostbyname("localhost"), socket.getaddrinfo("localhost", 80, socket.AF_INET6)[0][4][0])`
	if out := strings.TrimSpace(e.ok("exec", id, "--", "python3", "-c", resolve)); out != "127.0.0.1 ::1" {
		t.Fatalf("localhost in the sandbox: %q, want 127.0.0.1 and ::1", out)
	}
	// A server on 127.0.0.1 answers a client that dials localhost.
	e.ok("exec", "-d", id, "--", "python3", "-m", "http.server", "-b", "127.0.0.1", "8000")
	waitFor(t, func() bool {
		return e.run(nil, "exec", id, "--", "curl", "-fsS", "-o", "/dev/null", "http://localhost:8000/").code == 0
	})
	// The file is the sandbox's: root adds a name, a user cannot.
	if r := e.run(nil, "exec", "--user", "1000", id, "--", "sh", "-c", "echo x >> /etc/hosts"); r.code == 0 {
		t.Errorf("an unprivileged user wrote /etc/hosts")
	}
	e.ok("exec", "--user", "root", id, "--", "sh", "-c", "echo '127.0.0.1 app.internal' >> /etc/hosts")
	if out := strings.TrimSpace(e.ok("exec", id, "--", "getent", "hosts", "app.internal")); !strings.HasPrefix(out, "127.0.0.1") {
		t.Fatalf("after root added app.internal: getent says %q", out)
	}

	forks := strings.Fields(e.ok("fork", id))
	if len(forks) != 1 {
		t.Fatalf("fork: %q", forks)
	}
	t.Cleanup(func() { e.run(nil, "rm", "-f", forks[0]) })
	if out := strings.TrimSpace(e.ok("exec", forks[0], "--", "python3", "-c", resolve)); out != "127.0.0.1 ::1" {
		t.Fatalf("localhost in the fork: %q", out)
	}
}
