package engine

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func testCAPEM(t *testing.T, cn string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// An image's symbolic links resolve inside its root filesystem: an
// absolute link names a path of the image, never one of the host.
func TestImageCABundle(t *testing.T) {
	host := t.TempDir()
	write(t, filepath.Join(host, "etc/ssl/cert.pem"), "HOST BUNDLE\n")

	debian := t.TempDir()
	write(t, filepath.Join(debian, "etc/ssl/certs/ca-certificates.crt"), "DEBIAN\n")

	alpine := t.TempDir()
	write(t, filepath.Join(alpine, "etc/ssl/certs/ca-certificates.crt"), "ALPINE\n")
	if err := os.Symlink("certs/ca-certificates.crt", filepath.Join(alpine, "etc/ssl/cert.pem")); err != nil {
		t.Fatal(err)
	}

	fedora := t.TempDir()
	write(t, filepath.Join(fedora, "etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem"), "FEDORA\n")
	if err := os.MkdirAll(filepath.Join(fedora, "etc/pki/tls/certs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", filepath.Join(fedora, "etc/pki/tls/certs/ca-bundle.crt")); err != nil {
		t.Fatal(err)
	}

	hostile := t.TempDir()
	if err := os.MkdirAll(filepath.Join(hostile, "etc/ssl/certs"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Points at the host's file if followed on the host.
	if err := os.Symlink(filepath.Join(host, "etc/ssl/cert.pem"), filepath.Join(hostile, "etc/ssl/certs/ca-certificates.crt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../../../../../../"+strings.TrimPrefix(host, "/")+"/etc/ssl/cert.pem", filepath.Join(hostile, "etc/ssl/cert.pem")); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name, rootfs, dest, content string
	}{
		{"debian", debian, "/etc/ssl/certs/ca-certificates.crt", "DEBIAN\n"},
		{"alpine", alpine, "/etc/ssl/certs/ca-certificates.crt", "ALPINE\n"},
		{"fedora", fedora, "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", "FEDORA\n"},
		{"none", t.TempDir(), defaultCABundle, ""},
		{"hostile links", hostile, defaultCABundle, ""},
	} {
		dest, b, err := imageCABundle(tc.rootfs)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if dest != tc.dest || string(b) != tc.content {
			t.Errorf("%s: bundle at %s holding %q; want %s holding %q", tc.name, dest, b, tc.dest, tc.content)
		}
	}
}

func TestTrustDir(t *testing.T) {
	e := &Engine{opts: Options{Root: t.TempDir()}}
	if cas, err := e.TrustedCAs(); err != nil || len(cas) != 0 {
		t.Fatalf("a new root trusts %v (%v)", cas, err)
	}
	corp := testCAPEM(t, "Corp Proxy CA")
	if err := e.AddTrustedCA("corp", CACert{Source: "corp.crt", PEM: append([]byte("subject=CN=Corp\n"), corp...)}); err != nil {
		t.Fatal(err)
	}
	if err := e.AddTrustedCA("corp", CACert{Source: "corp.crt", PEM: corp}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("adding corp twice: %v, want already exists", err)
	}
	for _, bad := range []string{"", "../x", ".hidden", "a/b"} {
		if err := e.AddTrustedCA(bad, CACert{Source: "corp.crt", PEM: corp}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("name %q: %v, want invalid argument", bad, err)
		}
	}
	if err := e.AddTrustedCA("key", CACert{Source: "key.pem", PEM: []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("a private key was kept: %v", err)
	}
	// A file dropped in by hand counts too.
	write(t, filepath.Join(e.TrustDir(), "lab.pem"), string(testCAPEM(t, "Lab CA")))
	write(t, filepath.Join(e.TrustDir(), "README"), "not a certificate")
	cas, err := e.TrustedCAs()
	if err != nil {
		t.Fatal(err)
	}
	if len(cas) != 2 || cas[0].Name != "corp" || cas[0].Subject != "CN=Corp Proxy CA" || cas[1].Name != "lab" {
		t.Fatalf("trusted: %+v", cas)
	}
	certs, err := e.extraCAs([]CACert{{Source: "extra.crt", PEM: testCAPEM(t, "Extra CA")}})
	if err != nil || len(certs) != 3 || certs[2].Subject.CommonName != "Extra CA" {
		t.Fatalf("extra CAs: %d %v", len(certs), err)
	}
	if _, err := e.extraCAs([]CACert{{Source: "bad.crt", PEM: []byte("nope")}}); err == nil || !strings.Contains(err.Error(), "bad.crt") {
		t.Fatalf("a bad --ca-cert: %v, want an error naming it", err)
	}

	// A sandbox's bundle: its image's, then the extra certificates.
	rootfs := t.TempDir()
	write(t, filepath.Join(rootfs, "etc/ssl/certs/ca-certificates.crt"), "IMAGE BUNDLE")
	sb := &record{ID: "abc"}
	if err := os.MkdirAll(e.sandboxDir(sb.ID), 0o700); err != nil {
		t.Fatal(err)
	}
	mounts, env, err := e.prepareCAs(sb, rootfs, certs)
	if err != nil {
		t.Fatal(err)
	}
	if len(mounts) != 1 || mounts[0].Destination != "/etc/ssl/certs/ca-certificates.crt" || !strings.Contains(strings.Join(mounts[0].Options, ","), "ro") {
		t.Fatalf("mounts: %+v", mounts)
	}
	b, _ := os.ReadFile(mounts[0].Source)
	if !strings.HasPrefix(string(b), "IMAGE BUNDLE\n-----BEGIN CERTIFICATE-----") || strings.Count(string(b), "BEGIN CERTIFICATE") != 3 {
		t.Fatalf("bundle:\n%s", b)
	}
	if len(env) == 0 || env[0] != "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt" || len(sb.CACerts) != 3 {
		t.Fatalf("env %v, record %v", env, sb.CACerts)
	}
	if m, _, _ := e.prepareCAs(sb, rootfs, nil); m != nil {
		t.Fatalf("no extra CA, yet a mount: %+v", m)
	}

	// A fork gets its own copy.
	if err := os.MkdirAll(e.sandboxDir("def"), 0o700); err != nil {
		t.Fatal(err)
	}
	spec := &specs.Spec{Mounts: append([]specs.Mount{{Destination: "/x", Type: "bind", Source: "/elsewhere/x"}}, mounts...)}
	if err := e.adoptMounts(spec, "abc", "def"); err != nil {
		t.Fatal(err)
	}
	if spec.Mounts[0].Source != "/elsewhere/x" || spec.Mounts[1].Source != filepath.Join(e.sandboxDir("def"), caBundleFile) {
		t.Fatalf("fork mounts: %+v", spec.Mounts)
	}

	if err := e.RemoveTrustedCA("corp"); err != nil {
		t.Fatal(err)
	}
	if err := e.RemoveTrustedCA("lab"); err != nil {
		t.Fatal(err)
	}
	if err := e.RemoveTrustedCA("corp"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("removing corp twice: %v", err)
	}
}
