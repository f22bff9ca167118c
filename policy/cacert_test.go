package policy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// testCert makes a self-signed CA certificate named cn, as DER.
func testCert(t testing.TB, cn string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func pemOf(typ string, b []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}))
}

func TestParseCACerts(t *testing.T) {
	a, b := testCert(t, "CA A"), testCert(t, "CA B")
	for _, tc := range []struct {
		name, data string
		want       []string // common names; nil: an error
		errHas     string
	}{
		{name: "one", data: pemOf("CERTIFICATE", a), want: []string{"CA A"}},
		{name: "two with text between", data: "subject=CN = CA A\n" + pemOf("CERTIFICATE", a) + "\n# next\n" + pemOf("CERTIFICATE", b), want: []string{"CA A", "CA B"}},
		{name: "private key", data: pemOf("CERTIFICATE", a) + pemOf("PRIVATE KEY", []byte("secret")), errHas: `block 2 is a "PRIVATE KEY"`},
		{name: "empty", data: "", errHas: "no PEM certificate"},
		{name: "text only", data: "hello\n", errHas: "no PEM certificate"},
		{name: "DER", data: string(a), errHas: "it is DER"},
		{name: "bad certificate", data: pemOf("CERTIFICATE", []byte("not DER")), errHas: "certificate 1"},
		{name: "too large", data: pemOf("CERTIFICATE", a) + strings.Repeat("x", MaxCAFileSize), errHas: "larger than 1024 KiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			certs, err := ParseCACerts("corp.crt", []byte(tc.data))
			if tc.want == nil {
				if err == nil {
					t.Fatalf("ParseCACerts accepted %s", tc.name)
				}
				if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "corp.crt") || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("error %q: want an invalid argument naming corp.crt and saying %q", err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range certs {
				got = append(got, c.Subject.CommonName)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestParseCACertsBoundsCount(t *testing.T) {
	one := pemOf("CERTIFICATE", testCert(t, "many"))
	_, err := ParseCACerts("many.pem", []byte(strings.Repeat(one, MaxCACerts+1)))
	if err == nil || !strings.Contains(err.Error(), "more than 256") {
		t.Fatalf("a file of %d certificates: %v", MaxCACerts+1, err)
	}
}

func TestCABundle(t *testing.T) {
	a, b := testCert(t, "CA A"), testCert(t, "CA B")
	certs, err := ParseCACerts("x", []byte(pemOf("CERTIFICATE", a)+pemOf("CERTIFICATE", b)+"junk\n"+pemOf("CERTIFICATE", a)))
	if err != nil {
		t.Fatal(err)
	}
	out, err := CABundle(certs)
	if err != nil {
		t.Fatal(err)
	}
	if want := pemOf("CERTIFICATE", a) + pemOf("CERTIFICATE", b); string(out) != want {
		t.Fatalf("bundle:\n%s\nwant each certificate once, in order, as clean PEM:\n%s", out, want)
	}
	if len(Fingerprint(certs[0])) != 64 {
		t.Fatalf("fingerprint %q: want 64 hex digits", Fingerprint(certs[0]))
	}
}

func TestCAEnvFor(t *testing.T) {
	env := strings.Join(CAEnvFor("/etc/ssl/certs/ca-certificates.crt"), " ")
	for _, k := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS"} {
		if !strings.Contains(env, k+"=/etc/ssl/certs/ca-certificates.crt") {
			t.Fatalf("%s not set: %s", k, env)
		}
	}
}

func FuzzParseCACerts(f *testing.F) {
	f.Add([]byte(pemOf("CERTIFICATE", testCert(f, "fuzz"))))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		certs, err := ParseCACerts("fuzz", data)
		if err == nil && len(certs) == 0 {
			t.Fatal("no error and no certificate")
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("error %v is not an invalid argument", err)
		}
	})
}
