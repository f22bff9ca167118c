package engine

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/policy"
)

// Extra CA certificates reach a sandbox without changing its image: hutch
// writes the image's own system bundle followed by the extra certificates
// to a file in the sandbox's state directory and bind-mounts it, read-only,
// over the image's bundle; every process gets the policy.CAEnv variables
// naming it. A snapshot, a setup cache or a pushed image never holds them,
// since the mount is not part of the sandbox's writable layer.

// CACert is a PEM file of certificates to trust besides the system's.
type CACert struct {
	// Source says where it came from (a file name), for errors.
	Source string
	PEM    []byte
}

// ReadCACert reads and checks a PEM file of CA certificates (--ca-cert
// FILE): at most policy.MaxCAFileSize, certificates only.
func ReadCACert(file string) (CACert, error) {
	f, err := os.Open(file)
	if err != nil {
		return CACert{}, fmt.Errorf("CA certificate file: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, policy.MaxCAFileSize+1))
	if err != nil {
		return CACert{}, fmt.Errorf("CA certificate file %s: %v: %w", file, err, errdefs.ErrInvalidArgument)
	}
	if _, err := policy.ParseCACerts(file, b); err != nil {
		return CACert{}, err
	}
	return CACert{Source: file, PEM: b}, nil
}

// caBundleFile is the sandbox's bundle in its state directory.
const caBundleFile = "ca-certificates.crt"

// defaultCABundle is where a bundle goes in an image that has none.
const defaultCABundle = "/etc/ssl/certs/ca-certificates.crt"

// systemCABundles are where distributions keep their bundle of trusted
// certificates, as Go's crypto/x509 looks for it: the first an image has
// is its system bundle.
var systemCABundles = []string{
	"/etc/ssl/certs/ca-certificates.crt",                // Debian, Ubuntu, Alpine, Arch
	"/etc/pki/tls/certs/ca-bundle.crt",                  // Fedora, RHEL
	"/etc/ssl/ca-bundle.pem",                            // openSUSE
	"/etc/pki/tls/cacert.pem",                           // OpenELEC
	"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", // CentOS, RHEL 7
	"/etc/ssl/cert.pem",                                 // Alpine, BSDs
}

// maxSystemBundle bounds the image's bundle that hutch reads: an image is
// not trusted to keep it small.
const maxSystemBundle = 16 << 20

// TrustDir is the state root's directory of CA certificates that every
// new sandbox, and the registry client, trusts: its *.crt and *.pem files.
func (e *Engine) TrustDir() string { return filepath.Join(e.opts.Root, "ca-certificates") }

// TrustedCA is one certificate of the state root's trust directory.
type TrustedCA struct {
	// Name is the file's name without its extension.
	Name        string    `json:"name"`
	File        string    `json:"file"`
	Subject     string    `json:"subject"`
	NotAfter    time.Time `json:"notAfter"`
	Fingerprint string    `json:"sha256"`
}

// caNameRE leaves the length (at most 64) to validCAName: a bounded
// repetition is a large compile at every process start.
var caNameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

func validCAName(n string) bool { return len(n) <= 64 && caNameRE.MatchString(n) }

// TrustedCAs lists the certificates of TrustDir, by file name. A file
// that is not a valid PEM file of certificates is an error naming it:
// creates fail on it too.
func (e *Engine) TrustedCAs() ([]TrustedCA, error) {
	files, err := e.trustFiles()
	if err != nil {
		return nil, err
	}
	var out []TrustedCA
	for _, f := range files {
		certs, err := policy.ParseCACerts(f.Source, f.PEM)
		if err != nil {
			return nil, err
		}
		base := filepath.Base(f.Source)
		for _, c := range certs {
			out = append(out, TrustedCA{
				Name: strings.TrimSuffix(base, filepath.Ext(base)), File: f.Source,
				Subject: c.Subject.String(), NotAfter: c.NotAfter.UTC(), Fingerprint: policy.Fingerprint(c),
			})
		}
	}
	return out, nil
}

// trustFiles reads TrustDir's *.crt and *.pem files, in name order.
func (e *Engine) trustFiles() ([]CACert, error) {
	entries, err := os.ReadDir(e.TrustDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []CACert
	for _, ent := range entries {
		ext := filepath.Ext(ent.Name())
		if ent.IsDir() || (ext != ".crt" && ext != ".pem") {
			continue
		}
		c, err := ReadCACert(filepath.Join(e.TrustDir(), ent.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// AddTrustedCA checks c and keeps it in TrustDir as NAME.crt, so that
// every later sandbox and registry access trusts it. An existing NAME is
// an error.
func (e *Engine) AddTrustedCA(name string, c CACert) error {
	if !validCAName(name) {
		return fmt.Errorf("CA name %q: want 1-64 of [a-zA-Z0-9_.-], starting with a letter or digit: %w", name, errdefs.ErrInvalidArgument)
	}
	certs, err := policy.ParseCACerts(c.Source, c.PEM)
	if err != nil {
		return err
	}
	b, err := policy.CABundle(certs)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(e.TrustDir(), 0o755); err != nil {
		return err
	}
	dst := filepath.Join(e.TrustDir(), name+".crt")
	if _, err := os.Stat(filepath.Join(e.TrustDir(), name+".pem")); err == nil {
		return fmt.Errorf("CA %s: %s.pem exists: %w", name, name, errdefs.ErrAlreadyExists)
	}
	tmp, err := os.CreateTemp(e.TrustDir(), ".add-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	// A link fails if the name is taken, where a rename would replace it.
	if err := os.Link(tmp.Name(), dst); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("CA %s exists (hutch ca rm %s first): %w", name, name, errdefs.ErrAlreadyExists)
		}
		return err
	}
	return nil
}

// RemoveTrustedCA removes NAME.crt (or NAME.pem) from TrustDir.
func (e *Engine) RemoveTrustedCA(name string) error {
	if !validCAName(name) {
		return fmt.Errorf("CA name %q: %w", name, errdefs.ErrInvalidArgument)
	}
	for _, ext := range []string{".crt", ".pem"} {
		err := os.Remove(filepath.Join(e.TrustDir(), name+ext))
		if err == nil {
			return nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return fmt.Errorf("CA %s: not in %s: %w", name, e.TrustDir(), errdefs.ErrNotFound)
}

// extraCAs parses the state root's trusted certificates and extra, in
// that order.
func (e *Engine) extraCAs(extra []CACert) ([]*x509.Certificate, error) {
	files, err := e.trustFiles()
	if err != nil {
		return nil, err
	}
	var certs []*x509.Certificate
	for _, f := range append(files, extra...) {
		src := f.Source
		if src == "" {
			src = "(unnamed)"
		}
		c, err := policy.ParseCACerts(src, f.PEM)
		if err != nil {
			return nil, err
		}
		certs = append(certs, c...)
	}
	if _, err := policy.CABundle(certs); err != nil {
		return nil, err
	}
	return certs, nil
}

// certPool is the system's pool plus certs; nil when certs is empty.
func certPool(certs []*x509.Certificate) *x509.CertPool {
	if len(certs) == 0 {
		return nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool
}

// prepareCAs writes the bundle of sandbox sb (its image's system bundle,
// read from rootfs, then certs) into its state directory, and returns the
// mount that puts it over the image's bundle and the variables that name
// it. With no certs, it does nothing.
func (e *Engine) prepareCAs(sb *record, rootfs string, certs []*x509.Certificate) ([]specs.Mount, []string, error) {
	if len(certs) == 0 {
		return nil, nil, nil
	}
	extra, err := policy.CABundle(certs)
	if err != nil {
		return nil, nil, err
	}
	dest, system, err := imageCABundle(rootfs)
	if err != nil {
		return nil, nil, err
	}
	if len(system) > 0 && system[len(system)-1] != '\n' {
		system = append(system, '\n')
	}
	file := filepath.Join(e.sandboxDir(sb.ID), caBundleFile)
	if err := os.WriteFile(file, append(system, extra...), 0o644); err != nil {
		return nil, nil, err
	}
	for _, c := range certs {
		desc := c.Subject.String() + " sha256:" + policy.Fingerprint(c)[:16]
		if !slices.Contains(sb.CACerts, desc) {
			sb.CACerts = append(sb.CACerts, desc)
		}
	}
	mount := specs.Mount{Destination: dest, Type: "bind", Source: file, Options: []string{"rbind", "ro"}}
	return []specs.Mount{mount}, policy.CAEnvFor(dest), nil
}

// imageCABundle finds the image's system bundle under rootfs: its path in
// the image (symlinks resolved inside rootfs) and its content, or
// defaultCABundle and nothing when the image has none.
func imageCABundle(rootfs string) (string, []byte, error) {
	for _, p := range systemCABundles {
		resolved, err := resolveIn(rootfs, p)
		if err != nil {
			continue
		}
		host := filepath.Join(rootfs, resolved)
		st, err := os.Lstat(host)
		if err != nil || !st.Mode().IsRegular() {
			continue
		}
		if st.Size() > maxSystemBundle {
			return "", nil, fmt.Errorf("the image's CA bundle %s is larger than %d MiB: %w", p, maxSystemBundle>>20, errdefs.ErrInvalidArgument)
		}
		b, err := os.ReadFile(host)
		if err != nil {
			return "", nil, err
		}
		return resolved, b, nil
	}
	return defaultCABundle, nil, nil
}

// resolveIn resolves the absolute path p inside rootfs as the sandbox
// would see it: symbolic links, absolute or relative, stay inside rootfs.
// It returns the resolved path inside rootfs.
func resolveIn(rootfs, p string) (string, error) {
	todo := strings.Split(strings.TrimPrefix(path.Clean(p), "/"), "/")
	cur := "/"
	for links := 0; len(todo) > 0; {
		name := todo[0]
		todo = todo[1:]
		if name == "" || name == "." {
			continue
		}
		if name == ".." {
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, name)
		st, err := os.Lstat(filepath.Join(rootfs, next))
		if err != nil {
			return "", err
		}
		if st.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if links++; links > 40 {
			return "", fmt.Errorf("%s: too many symbolic links", p)
		}
		target, err := os.Readlink(filepath.Join(rootfs, next))
		if err != nil {
			return "", err
		}
		if strings.HasPrefix(target, "/") {
			cur = "/"
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	return cur, nil
}

// adoptMounts gives a fork its own copies of the files its parent's spec
// bind-mounts from the parent's state directory (its CA bundle, its
// resolv.conf), so that the fork does not depend on its parent's
// directory.
func (e *Engine) adoptMounts(spec *specs.Spec, parent, id string) error {
	from := e.sandboxDir(parent)
	for i, m := range spec.Mounts {
		if m.Type != "bind" || filepath.Dir(m.Source) != from {
			continue
		}
		b, err := os.ReadFile(m.Source)
		if err != nil {
			return err
		}
		dst := filepath.Join(e.sandboxDir(id), filepath.Base(m.Source))
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			return err
		}
		spec.Mounts[i].Source = dst
	}
	return nil
}
