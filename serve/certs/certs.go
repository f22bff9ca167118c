// Package certs is the TLS of `hutch serve`: the certificate and key
// files it serves, reloaded while it runs, and a development CA that
// issues a wildcard certificate for the server's domain when no public
// CA is at hand.
package certs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
)

// Reloader serves the certificate of a pair of PEM files, and loads them
// again on Reload: handshakes after a reload get the new certificate,
// and connections already open keep theirs.
type Reloader struct {
	certFile, keyFile string
	domain            string
	cur               atomic.Pointer[tls.Certificate]
}

// NewReloader loads certFile and keyFile (PEM; the certificate file may
// hold the chain after the leaf). The certificate must cover domain and
// *.domain, the API's and the sandboxes' hosts, unless domain is empty.
func NewReloader(certFile, keyFile, domain string) (*Reloader, error) {
	r := &Reloader{certFile: certFile, keyFile: keyFile, domain: domain}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Reload loads the files again. On an error the certificate served so
// far stays.
func (r *Reloader) Reload() error {
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("TLS certificate %s and key %s: %w", r.certFile, r.keyFile, err)
	}
	if r.domain != "" {
		if err := Covers(cert.Leaf, r.domain); err != nil {
			return fmt.Errorf("TLS certificate %s: %w", r.certFile, err)
		}
	}
	r.cur.Store(&cert)
	return nil
}

// Certificate is the certificate served now.
func (r *Reloader) Certificate() *tls.Certificate { return r.cur.Load() }

// Config is the TLS configuration of a server with r's certificate:
// TLS 1.2 or later, and HTTP/2 offered before HTTP/1.1.
func (r *Reloader) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return r.cur.Load(), nil
		},
	}
}

// Expired is the warning for a certificate that clients refuse for its
// dates, or "". Such a certificate is still served, as one that expires
// while the server runs is: the operator sees the warning, and clients
// report the expiry as they do any other server's.
func Expired(leaf *x509.Certificate) string {
	switch now := time.Now(); {
	case now.After(leaf.NotAfter):
		return "the TLS certificate expired at " + leaf.NotAfter.UTC().Format(time.RFC3339) + ": clients refuse it"
	case now.Before(leaf.NotBefore):
		return "the TLS certificate is not valid before " + leaf.NotBefore.UTC().Format(time.RFC3339) + ": clients refuse it"
	}
	return ""
}

// Covers is the error of a certificate that does not name both domain
// and *.domain (the API's api.DOMAIN and the sandboxes' PORT-ID.DOMAIN).
func Covers(leaf *x509.Certificate, domain string) error {
	if leaf == nil {
		return errors.New("no certificate in the file")
	}
	var missing []string
	for _, name := range []string{domain, "sandbox-host." + domain} {
		if leaf.VerifyHostname(name) != nil {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		want := []string{domain, "*." + domain}
		return fmt.Errorf("it does not cover %s (its names: %s): the server needs one that covers %s", strings.Join(pick(want, missing), " and "), strings.Join(leaf.DNSNames, ", "), strings.Join(want, " and "))
	}
	return nil
}

// pick is the names of want whose probe is in missing: domain for
// domain, the wildcard for the probe below it.
func pick(want, missing []string) []string {
	var out []string
	for _, m := range missing {
		if strings.HasPrefix(m, "sandbox-host.") {
			out = append(out, want[1])
		} else {
			out = append(out, want[0])
		}
	}
	return out
}
