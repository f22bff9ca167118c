package policy

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"

	"github.com/containerd/errdefs"
)

// MaxCAFileSize bounds one file of CA certificates (--ca-cert, or one in
// the state root's trust directory). Debian's whole system bundle, some
// 140 certificates, is about 220 KiB.
const MaxCAFileSize = 1 << 20

// MaxCACerts bounds the extra certificates one sandbox trusts.
const MaxCACerts = 256

// CAEnv are the variables that name a CA bundle file for the programs that
// do not read the system's (or read it only when told): OpenSSL and
// Python's ssl (SSL_CERT_FILE), Python requests (REQUESTS_CA_BUNDLE), pip
// (PIP_CERT), curl (CURL_CA_BUNDLE), git (GIT_SSL_CAINFO) and Node
// (NODE_EXTRA_CA_CERTS, which adds to Node's own list).
var CAEnv = []string{
	"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE",
	"GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS",
}

// CAEnvFor points every CAEnv variable at bundle, a path in the sandbox.
func CAEnvFor(bundle string) []string {
	env := make([]string, 0, len(CAEnv))
	for _, k := range CAEnv {
		env = append(env, k+"="+bundle)
	}
	return env
}

// ParseCACerts reads the certificates of a PEM file, from source (a file
// name, for errors). Text between PEM blocks is allowed (openssl writes
// some); any block that is not a CERTIFICATE (a private key given by
// mistake) is refused, as are a file without any certificate, one larger
// than MaxCAFileSize, and certificates x509 cannot parse.
func ParseCACerts(source string, data []byte) ([]*x509.Certificate, error) {
	if len(data) > MaxCAFileSize {
		return nil, fmt.Errorf("CA certificate file %s: larger than %d KiB: %w", source, MaxCAFileSize>>10, errdefs.ErrInvalidArgument)
	}
	var certs []*x509.Certificate
	rest := data
	for n := 1; ; n++ {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("CA certificate file %s: block %d is a %q, not a CERTIFICATE: %w", source, n, b.Type, errdefs.ErrInvalidArgument)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("CA certificate file %s: certificate %d: %v: %w", source, n, err, errdefs.ErrInvalidArgument)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		hint := ""
		if _, err := x509.ParseCertificate(data); err == nil {
			hint = " (it is DER: convert it with openssl x509 -inform der -in FILE -out FILE.pem)"
		}
		return nil, fmt.Errorf("CA certificate file %s: no PEM certificate in it%s: %w", source, hint, errdefs.ErrInvalidArgument)
	}
	if len(certs) > MaxCACerts {
		return nil, fmt.Errorf("CA certificate file %s: %d certificates, more than %d: %w", source, len(certs), MaxCACerts, errdefs.ErrInvalidArgument)
	}
	return certs, nil
}

// Fingerprint is a certificate's SHA-256, as openssl x509 -fingerprint
// -sha256 prints it without colons, lower case.
func Fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}

// CABundle renders certs as PEM, each once (the first of equal ones), in
// order. It fails past MaxCACerts.
func CABundle(certs []*x509.Certificate) ([]byte, error) {
	var buf bytes.Buffer
	seen := map[string]bool{}
	for _, c := range certs {
		fp := Fingerprint(c)
		if seen[fp] {
			continue
		}
		seen[fp] = true
		if len(seen) > MaxCACerts {
			return nil, fmt.Errorf("more than %d extra CA certificates: %w", MaxCACerts, errdefs.ErrInvalidArgument)
		}
		if err := pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}
