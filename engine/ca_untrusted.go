package engine

import (
	"crypto/x509"
	"os"
	"slices"

	"hutch.dev/hutch/policy"
)

// UntrustedCAFiles returns those of files, PEM files of CA certificates
// (the host's own, say), that hold a certificate TrustDir does not: what
// new sandboxes would not trust. A file that cannot be read or is not a
// PEM file of certificates is left out.
func (e *Engine) UntrustedCAFiles(files []string) ([]string, error) {
	cas, err := e.TrustedCAs()
	if err != nil {
		return nil, err
	}
	trusted := map[string]bool{}
	for _, ca := range cas {
		trusted[ca.Fingerprint] = true
	}
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		certs, err := policy.ParseCACerts(f, b)
		if err != nil {
			continue
		}
		if slices.ContainsFunc(certs, func(c *x509.Certificate) bool { return !trusted[policy.Fingerprint(c)] }) {
			out = append(out, f)
		}
	}
	return out, nil
}
