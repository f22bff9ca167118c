package certs

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func pool(t *testing.T, caFile string) *x509.CertPool {
	t.Helper()
	b, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		t.Fatalf("%s holds no certificate", caFile)
	}
	return p
}

func leaf(t *testing.T, certFile, keyFile string) *x509.Certificate {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return pair.Leaf
}

// A development certificate verifies against its CA for the domain, its
// sandbox hosts and loopback, for nothing else, and its keys are 0600.
func TestDevCertificate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	f, err := Dev(dir, "dev.hutch.test")
	if err != nil {
		t.Fatal(err)
	}
	if !f.NewCA || !f.NewCert {
		t.Fatalf("first Dev: %+v, want a new CA and certificate", f)
	}
	for _, name := range []string{f.Key, filepath.Join(dir, caKey)} {
		st, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", name, st.Mode().Perm())
		}
	}
	roots := pool(t, f.CA)
	l := leaf(t, f.Cert, f.Key)
	for _, host := range []string{"dev.hutch.test", "api.dev.hutch.test", "49983-abc.dev.hutch.test", "localhost", "127.0.0.1"} {
		if _, err := l.Verify(x509.VerifyOptions{DNSName: host, Roots: roots}); err != nil {
			t.Errorf("%s: %v", host, err)
		}
	}
	for _, host := range []string{"other.test", "a.b.dev.hutch.test"} {
		if _, err := l.Verify(x509.VerifyOptions{DNSName: host, Roots: roots}); err == nil {
			t.Errorf("%s verified, want refused", host)
		}
	}

	// Its CA can issue for its domain only: a certificate it signed for
	// another name does not verify, though the client trusts the CA.
	ca, key, err := loadCA(dir, "dev.hutch.test")
	if err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "other")
	if err := issue(other+".pem", other+".key", ca, key, "bank.example.test"); err != nil {
		t.Fatal(err)
	}
	if _, err := leaf(t, other+".pem", other+".key").Verify(x509.VerifyOptions{DNSName: "bank.example.test", Roots: roots}); err == nil || !strings.Contains(err.Error(), "constraint") {
		t.Errorf("a certificate for another domain from the development CA: %v, want a name constraint error", err)
	}

	// Again: the same files. For another domain: a new CA.
	again, err := Dev(dir, "dev.hutch.test")
	if err != nil {
		t.Fatal(err)
	}
	if again.NewCA || again.NewCert || !leaf(t, again.Cert, again.Key).Equal(l) {
		t.Errorf("second Dev made new files: %+v", again)
	}
	moved, err := Dev(dir, "moved.hutch.test")
	if err != nil {
		t.Fatal(err)
	}
	if !moved.NewCA || !moved.NewCert {
		t.Errorf("Dev for another domain: %+v, want a new CA and certificate", moved)
	}
	if _, err := leaf(t, moved.Cert, moved.Key).Verify(x509.VerifyOptions{DNSName: "api.moved.hutch.test", Roots: pool(t, moved.CA)}); err != nil {
		t.Error(err)
	}
}

// Reload serves the new files; a bad pair on disk keeps the old
// certificate; a certificate for another domain is refused by name.
func TestReloader(t *testing.T) {
	dir := t.TempDir()
	f, err := Dev(filepath.Join(dir, "a"), "r.hutch.test")
	if err != nil {
		t.Fatal(err)
	}
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	cp := func(from, to string) {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cp(f.Cert, cert)
	cp(f.Key, key)
	r, err := NewReloader(cert, key, "r.hutch.test")
	if err != nil {
		t.Fatal(err)
	}
	first := r.Certificate().Leaf
	cfg := r.Config()
	if cfg.MinVersion != tls.VersionTLS12 || cfg.NextProtos[0] != "h2" {
		t.Errorf("config: min version %x, protocols %v; want TLS 1.2 and h2 first", cfg.MinVersion, cfg.NextProtos)
	}

	// A new certificate from the same CA.
	ca, caKeyPair, err := loadCA(filepath.Join(dir, "a"), "r.hutch.test")
	if err != nil {
		t.Fatal(err)
	}
	if err := issue(cert, key, ca, caKeyPair, "r.hutch.test"); err != nil {
		t.Fatal(err)
	}
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	second := r.Certificate().Leaf
	if second.Equal(first) {
		t.Fatal("Reload kept the old certificate")
	}
	got, _ := cfg.GetCertificate(&tls.ClientHelloInfo{})
	if !got.Leaf.Equal(second) {
		t.Error("the config's handshakes do not get the reloaded certificate")
	}

	// Half-written files: the old certificate stays.
	if err := os.WriteFile(key, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.Reload(); err == nil {
		t.Error("Reload of a broken key: no error")
	}
	if !r.Certificate().Leaf.Equal(second) {
		t.Error("a failed Reload changed the certificate")
	}

	// A certificate for another domain is named as such.
	g, err := Dev(filepath.Join(dir, "b"), "elsewhere.test")
	if err != nil {
		t.Fatal(err)
	}
	_, err = NewReloader(g.Cert, g.Key, "r.hutch.test")
	if err == nil || !strings.Contains(err.Error(), "does not cover r.hutch.test and *.r.hutch.test") {
		t.Errorf("a certificate for elsewhere.test on r.hutch.test: %v", err)
	}
}
