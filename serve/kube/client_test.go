package kube

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// writeCert writes a self-signed certificate and its key into dir.
func writeCert(t *testing.T, dir string) (certPath, keyPath string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = filepath.Join(dir, "c.crt"), filepath.Join(dir, "c.key")
	os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)  //nolint:errcheck // read back below
	os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600) //nolint:errcheck // read back below
	return certPath, keyPath
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	writeCert(t, dir)
	conf := func(user string) string {
		return `apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "https://127.0.0.1:6443", certificate-authority: c.crt}
users:
- name: u
  user: ` + user + `
contexts:
- name: ctx
  context: {cluster: test, user: u, namespace: sandboxes}
current-context: ctx
`
	}
	write := func(body string) string {
		p := filepath.Join(dir, "kubeconfig")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// Relative paths are the kubeconfig's directory's.
	c, ns, err := Load(write(conf("{client-certificate: c.crt, client-key: c.key}")))
	if err != nil {
		t.Fatal(err)
	}
	if ns != "sandboxes" || c.Server() != "https://127.0.0.1:6443" || len(c.tls.Certificates) != 1 || c.tls.RootCAs == nil {
		t.Errorf("Load: namespace %q, server %s, %d certificates, CA %v", ns, c.Server(), len(c.tls.Certificates), c.tls.RootCAs != nil)
	}
	if c, _, err = Load(write(conf("{token: abc}"))); err != nil || c.token != "abc" {
		t.Errorf("Load with a token: %v, token %q", err, c.token)
	}
	for name, body := range map[string]string{
		"exec plugin":     conf("{exec: {command: aws}}"),
		"missing key":     conf("{client-certificate: c.crt, client-key: nope.key}"),
		"no such context": strings.Replace(conf("{token: a}"), "current-context: ctx", "current-context: other", 1),
		"not yaml":        "{{{",
	} {
		if _, _, err := Load(write(body)); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: Load error %v, want an invalid argument", name, err)
		}
	}
}

func TestExecStatus(t *testing.T) {
	req := ExecRequest{Namespace: "ns", Pod: "p", Args: []string{"x"}}
	ok := &status{Status: "Success"}
	if code, err := execStatus(req, ok); code != 0 || err != nil {
		t.Errorf("success: %d, %v", code, err)
	}
	exit := &status{Status: "Failure", Reason: "NonZeroExitCode"}
	exit.Details = &struct {
		Causes []struct {
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"causes"`
	}{Causes: []struct {
		Reason  string `json:"reason"`
		Message string `json:"message"`
	}{{Reason: "ExitCode", Message: "7"}}}
	if code, err := execStatus(req, exit); code != 7 || err != nil {
		t.Errorf("exit 7: %d, %v", code, err)
	}
	if _, err := execStatus(req, &status{Status: "Failure", Message: "executable file not found"}); err == nil || !strings.Contains(err.Error(), "executable file not found") {
		t.Errorf("exec failure: %v", err)
	}
	if _, err := execStatus(req, nil); !errdefs.IsUnavailable(err) {
		t.Errorf("no status: %v, want unavailable", err)
	}
}
