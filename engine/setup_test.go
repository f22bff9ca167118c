package engine

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"

	"hutch.dev/hutch/overlay"
	"hutch.dev/hutch/policy"
)

// The setup cache key changes with everything that can change the
// result, and with the scope; it never depends on the order of allow
// rules.
func TestSetupKeyInputs(t *testing.T) {
	img := overlay.Image{Digest: digest.FromString("img")}
	base := CreateRequest{Setup: []string{"echo hi > /f"}, Env: []string{"A=1"}, Workdir: "/w", Network: "allow", Allow: []string{"a.example.com", "b.example.com"}}
	k := setupKey(img, base, "", "")
	vary := map[string]func() string{
		"image":   func() string { return setupKey(overlay.Image{Digest: digest.FromString("other")}, base, "", "") },
		"scope":   func() string { return setupKey(img, base, "tenant-b", "") },
		"secrets": func() string { return setupKey(img, base, "", "mac") },
		"env":     func() string { r := base; r.Env = []string{"A=2"}; return setupKey(img, r, "", "") },
		"workdir": func() string { r := base; r.Workdir = "/x"; return setupKey(img, r, "", "") },
		"network": func() string { r := base; r.Network = "open"; return setupKey(img, r, "", "") },
		"allow":   func() string { r := base; r.Allow = []string{"a.example.com"}; return setupKey(img, r, "", "") },
		"dns":     func() string { r := base; r.DNS = []string{"10.0.0.53"}; return setupKey(img, r, "", "") },
		"ca":      func() string { r := base; r.CACerts = []CACert{{PEM: []byte("x")}}; return setupKey(img, r, "", "") },
		"setup":   func() string { r := base; r.Setup = []string{"echo ho > /f"}; return setupKey(img, r, "", "") },
	}
	for name, f := range vary {
		if f() == k {
			t.Errorf("a different %s gives the same setup key", name)
		}
	}
	r := base
	r.Allow = []string{"b.example.com", "a.example.com"}
	if setupKey(img, r, "", "") != k {
		t.Error("the order of allow rules changes the setup key")
	}
}

// Secrets are identified by a keyed MAC of names and values: the value
// never appears, another value or another root key gives another MAC.
func TestSecretsMAC(t *testing.T) {
	e := &Engine{opts: Options{Root: t.TempDir()}}
	key, err := e.setupMACKey()
	if err != nil {
		t.Fatal(err)
	}
	if again, err := e.setupMACKey(); err != nil || !bytes.Equal(again, key) {
		t.Fatalf("the root's key changed: %v", err)
	}
	fi, err := os.Stat(filepath.Join(e.opts.Root, "setup-cache.key"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	a := []policy.Secret{{Name: "TOKEN", Value: []byte("hunter2")}, {Name: "B", Value: []byte("x")}}
	swapped := []policy.Secret{a[1], a[0]}
	other := []policy.Secret{{Name: "TOKEN", Value: []byte("hunter3")}, {Name: "B", Value: []byte("x")}}
	moved := []policy.Secret{{Name: "TOKEN", Value: []byte("hunter2B")}, {Name: "", Value: []byte("x")}}
	m := secretsMAC(key, a)
	if m != secretsMAC(key, swapped) {
		t.Error("the order of secrets changes the MAC")
	}
	if m == secretsMAC(key, other) || m == secretsMAC(key, moved) {
		t.Error("different secrets give the same MAC")
	}
	if m == secretsMAC(bytes.Repeat([]byte{1}, 32), a) {
		t.Error("the MAC does not depend on the root's key")
	}
	if strings.Contains(m, "hunter2") || secretsMAC(key, nil) != "" {
		t.Errorf("MAC %q", m)
	}
}
