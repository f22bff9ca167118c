package forward

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/policy"
)

func TestListenSocket(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "app.sock")
	ls, err := Listen([]policy.PortMapping{{Socket: sock, Port: 8080}, {HostIP: "127.0.0.1", Port: 80}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, l := range ls {
			l.Listener.Close()
		}
	}()
	if m := ls[0].Mapping(); m.Socket != sock || m.Port != 8080 {
		t.Errorf("socket mapping = %+v", m)
	}
	if m := ls[1].Mapping(); m.HostIP != "127.0.0.1" || m.HostPort == 0 || m.Port != 80 {
		t.Errorf("tcp mapping = %+v", m)
	}
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", fi.Mode().Perm())
	}
}

func TestListenSocketRefusesOpenDirectory(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	_, err := Listen([]policy.PortMapping{{Socket: filepath.Join(dir, "app.sock"), Port: 8080}})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "writable by other users") {
		t.Fatalf("Listen in a mode 0777 directory: %v, want an invalid argument", err)
	}
}
