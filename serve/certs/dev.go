package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// The files of a development CA, in its directory. The keys are 0600;
// the directory is 0700.
const (
	CAFile   = "ca.pem"
	caKey    = "ca.key"
	CertFile = "cert.pem"
	KeyFile  = "key.pem"
)

// The lifetimes of what Dev issues: the leaf is renewed when less than
// renewBefore of it is left, as public CAs' are.
const (
	caLifetime   = 10 * 365 * 24 * time.Hour
	leafLifetime = 397 * 24 * time.Hour
	renewBefore  = 30 * 24 * time.Hour
)

// DevFiles are the files of a development CA and the certificate it
// issued for a domain.
type DevFiles struct {
	// CA is the CA's certificate: what clients are told to trust
	// (NODE_EXTRA_CA_CERTS, the system store).
	CA string
	// Cert and Key are the server's certificate and key.
	Cert, Key string
	// NewCA tells that the CA was made now (so clients must be told to
	// trust it); NewCert that the certificate was.
	NewCA, NewCert bool
}

// Dev is a development CA in dir and a certificate it issued for domain,
// *.domain, localhost and the loopback addresses; both are made the first
// time, and the certificate again when it nears its end or the CA no
// longer matches. The CA may issue for those names only (X.509 name
// constraints), so trusting it trusts nothing else: a CA made for another
// domain is replaced.
func Dev(dir, domain string) (DevFiles, error) {
	f := DevFiles{CA: filepath.Join(dir, CAFile), Cert: filepath.Join(dir, CertFile), Key: filepath.Join(dir, KeyFile)}
	if domain == "" {
		return f, errors.New("a development certificate needs a domain")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return f, err
	}
	ca, caKeyPair, err := loadCA(dir, domain)
	if err != nil {
		if ca, caKeyPair, err = newCA(dir, domain); err != nil {
			return f, fmt.Errorf("making a development CA in %s: %w", dir, err)
		}
		f.NewCA = true
	}
	if !f.NewCA && leafValid(f.Cert, f.Key, ca, domain) {
		return f, nil
	}
	if err := issue(f.Cert, f.Key, ca, caKeyPair, domain); err != nil {
		return f, fmt.Errorf("issuing a development certificate for %s: %w", domain, err)
	}
	f.NewCert = true
	return f, nil
}

// constraints are the names a development CA for domain may issue for.
func constraints(domain string) (dns []string, ips []*net.IPNet) {
	return []string{domain, "localhost"}, []*net.IPNet{
		{IP: net.IPv4(127, 0, 0, 0).To4(), Mask: net.CIDRMask(8, 32)},
		{IP: net.IPv6loopback, Mask: net.CIDRMask(128, 128)},
	}
}

func newCA(dir, domain string) (*x509.Certificate, crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	host, _ := os.Hostname()
	dns, ips := constraints(domain)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:                serial(),
		Subject:                     pkix.Name{Organization: []string{"hutch serve development CA"}, CommonName: fmt.Sprintf("hutch serve %s on %s", domain, host)},
		NotBefore:                   now.Add(-time.Hour),
		NotAfter:                    now.Add(caLifetime),
		KeyUsage:                    x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid:       true,
		IsCA:                        true,
		MaxPathLenZero:              true,
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         dns,
		PermittedIPRanges:           ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	if err := writeKey(filepath.Join(dir, caKey), key); err != nil {
		return nil, nil, err
	}
	if err := writePEM(filepath.Join(dir, CAFile), 0o644, "CERTIFICATE", der); err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

// loadCA is the CA in dir, if it is one for domain.
func loadCA(dir, domain string) (*x509.Certificate, crypto.Signer, error) {
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, CAFile), filepath.Join(dir, caKey))
	if err != nil {
		return nil, nil, err
	}
	ca := pair.Leaf
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok || !ca.IsCA || time.Until(ca.NotAfter) < leafLifetime {
		return nil, nil, errors.New("not a usable CA")
	}
	dns, _ := constraints(domain)
	if len(ca.PermittedDNSDomains) != len(dns) || ca.PermittedDNSDomains[0] != dns[0] {
		return nil, nil, fmt.Errorf("a CA for %v, not %s", ca.PermittedDNSDomains, domain)
	}
	return ca, signer, nil
}

// leafValid tells whether the certificate in certFile, with keyFile, was
// issued by ca for domain and has more than renewBefore left.
func leafValid(certFile, keyFile string, ca *x509.Certificate, domain string) bool {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil || Covers(pair.Leaf, domain) != nil || Expired(pair.Leaf) != "" || time.Until(pair.Leaf.NotAfter) < renewBefore {
		return false
	}
	return pair.Leaf.CheckSignatureFrom(ca) == nil
}

func issue(certFile, keyFile string, ca *x509.Certificate, caKey crypto.Signer, domain string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: domain},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{domain, "*." + domain, "localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return err
	}
	// The key first: a certificate on disk is never without its key.
	if err := writeKey(keyFile, key); err != nil {
		return err
	}
	return writePEM(certFile, 0o644, "CERTIFICATE", der)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, 0o600, "PRIVATE KEY", der)
}

// writePEM replaces path with one PEM block, atomically, with mode perm
// from its creation on.
func writePEM(path string, perm os.FileMode, kind string, der []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if err := pem.Encode(tmp, &pem.Block{Type: kind, Bytes: der}); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
