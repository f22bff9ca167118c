package egress

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
	"os"
	"sync"
	"time"
)

// A sandbox's gateway CA signs the certificates the gateway presents to
// the sandbox for the hosts it terminates TLS to (those with inject
// rules). It is made for one sandbox, lives in that sandbox's state
// directory, and is trusted inside that sandbox only.

// caLifetime is how long a sandbox's CA is valid; leafLifetime a host
// certificate it signs.
const (
	caLifetime   = 10 * 365 * 24 * time.Hour
	leafLifetime = 7 * 24 * time.Hour
)

// NewCA makes a CA for the sandbox id: its certificate, which the sandbox
// is to trust, and a PEM file holding the certificate and its key, for
// the gateway (LoadCA). Its name constraints permit only hosts (the
// inject rules' hosts): even trusted, it vouches for nothing else.
func NewCA(id string, hosts []string) (certPEM, bundlePEM []byte, err error) {
	if len(hosts) == 0 {
		return nil, nil, errors.New("gateway CA: no host to sign for")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	short := id
	if len(short) > 12 {
		short = short[:12]
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "hutch egress gateway " + short, Organization: []string{"hutch"}},
		NotBefore:    time.Now().Add(-time.Hour), NotAfter: time.Now().Add(caLifetime),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage:                    x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		PermittedDNSDomainsCritical: true, PermittedDNSDomains: hosts,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return certPEM, append(append([]byte{}, certPEM...), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})...), nil
}

// CA signs host certificates for a sandbox's gateway.
type CA struct {
	cert *x509.Certificate
	key  crypto.Signer
	// mu guards leaves: the certificates made so far, by host name.
	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// LoadCA reads the file NewCA made.
func LoadCA(path string) (*CA, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(b, b)
	if err != nil {
		return nil, fmt.Errorf("gateway CA %s: %w", path, err)
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, errors.New("gateway CA: the key cannot sign")
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: signer, leaves: map[string]*tls.Certificate{}}, nil
}

// leaf is the certificate for host, made on first use.
func (ca *CA) leaf(host string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.leaves[host]; ok && time.Until(c.Leaf.NotAfter) > time.Hour {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(leafLifetime),
		DNSNames: []string{host}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key, Leaf: leaf}
	ca.leaves[host] = c
	return c, nil
}
