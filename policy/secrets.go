package policy

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"regexp"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"
)

// SecretsDir is where a sandbox's secrets appear as files, on a tmpfs of
// gVisor's memory: never on the host's disk, never in the sandbox's
// writable layer (so never in a snapshot of it).
const SecretsDir = "/run/secrets"

// MaxSecretSize bounds one secret: it must fit in an environment variable
// (Linux allows 128 KiB per string).
const MaxSecretSize = 64 << 10

// Secret is one --secret: a name and where its value comes from. Its
// value, once loaded, is held in memory only; nothing in this package
// prints it.
type Secret struct {
	Name string
	// File or Env is the source: "@FILE" or "env:VAR".
	File, Env string
	// Value is the loaded value; Err why it could not be loaded.
	Value []byte
	Err   error
}

// Source is the secret's source as the user wrote it, without its value:
// "value" for a secret given by value.
func (s Secret) Source() string {
	switch {
	case s.File != "":
		return "@" + s.File
	case s.Env != "":
		return "env:" + s.Env
	}
	return "value"
}

// String shows the name and source, never the value.
func (s Secret) String() string { return s.Name + "=" + s.Source() }

var secretNameRE = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`)

// ParseSecret parses "K=@FILE" or "K=env:VAR". Its error never repeats
// what follows "=": a user who typed a value there by mistake must not
// see it echoed into a terminal log.
func ParseSecret(spec string) (Secret, error) {
	name, src, ok := strings.Cut(spec, "=")
	if !ok {
		return Secret{}, fmt.Errorf("%w: --secret: want NAME=@FILE or NAME=env:VAR", errdefs.ErrInvalidArgument)
	}
	if len(name) > 128 || !secretNameRE.MatchString(name) {
		return Secret{}, fmt.Errorf("%w: --secret %q: the name must match [A-Z_][A-Z0-9_]* (at most 128 characters)", errdefs.ErrInvalidArgument, truncate(name, 128))
	}
	s := Secret{Name: name}
	switch {
	case strings.HasPrefix(src, "@") && len(src) > 1:
		s.File = src[1:]
		if strings.ContainsRune(s.File, 0) {
			return Secret{}, fmt.Errorf("%w: --secret %s: bad file name", errdefs.ErrInvalidArgument, name)
		}
	case strings.HasPrefix(src, "env:") && len(src) > 4:
		s.Env = src[4:]
		if strings.ContainsAny(s.Env, "=\x00") {
			return Secret{}, fmt.Errorf("%w: --secret %s: bad variable name", errdefs.ErrInvalidArgument, name)
		}
	default:
		return Secret{}, fmt.Errorf("%w: --secret %s: want %s=@FILE or %s=env:VAR (values are never given on the command line)", errdefs.ErrInvalidArgument, name, name, name)
	}
	return s, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// LoadSecrets parses specs and loads each value with readFile or
// lookupEnv (ReadSecretFile and os.LookupEnv for the caller's host). A value
// that cannot be loaded is recorded in Secret.Err for Validate to report.
func LoadSecrets(specs []string, readFile func(string) ([]byte, error), lookupEnv func(string) (string, bool)) ([]Secret, error) {
	var out []Secret
	for _, spec := range specs {
		s, err := ParseSecret(spec)
		if err != nil {
			return nil, err
		}
		switch {
		case s.File != "":
			b, err := readFile(s.File)
			if err != nil {
				// The OS error names the file and the reason, not the
				// content.
				s.Err = fmt.Errorf("cannot read %s: %w", s.File, unwrapPath(err))
			}
			s.Value = b
		default:
			v, ok := lookupEnv(s.Env)
			if !ok {
				s.Err = fmt.Errorf("environment variable %s is not set", s.Env)
			}
			s.Value = []byte(v)
		}
		out = append(out, s)
	}
	return out, nil
}

// ReadSecretFile reads a secret's file as LoadSecrets should: only a
// regular file, opened without blocking (a FIFO or a device never holds
// the caller), its size checked before anything is read and the read
// itself bounded, so that a huge or growing file costs nothing.
func ReadSecretFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: not a regular file (%s)", errdefs.ErrInvalidArgument, fi.Mode().Type())
	}
	if fi.Size() > MaxSecretSize {
		return nil, fmt.Errorf("%w: larger than %s", errdefs.ErrInvalidArgument, FormatSize(MaxSecretSize))
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxSecretSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxSecretSize {
		return nil, fmt.Errorf("%w: larger than %s", errdefs.ErrInvalidArgument, FormatSize(MaxSecretSize))
	}
	return b, nil
}

// unwrapPath drops the *PathError wrapper, whose message would repeat the
// file name.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// secretChecks are the validator's rules for secrets.
var secretChecks = []check{
	{"secret-names", func(r Request) error {
		seen := map[string]bool{}
		for _, s := range r.Secrets {
			if !secretNameRE.MatchString(s.Name) {
				return fmt.Errorf("--secret %q: the name must match [A-Z_][A-Z0-9_]*", truncate(s.Name, 128))
			}
			if seen[s.Name] {
				return fmt.Errorf("--secret %s given twice", s.Name)
			}
			seen[s.Name] = true
		}
		for _, kv := range r.Env {
			if k, _, _ := strings.Cut(kv, "="); seen[k] {
				return fmt.Errorf("%s is both --env and --secret", k)
			}
		}
		return nil
	}},
	{"secret-sources", func(r Request) error {
		for _, s := range r.Secrets {
			if s.Err != nil {
				return fmt.Errorf("--secret %s: %w", s.Name, s.Err)
			}
		}
		return nil
	}},
	{"secret-values", func(r Request) error {
		for _, s := range r.Secrets {
			if len(s.Value) > MaxSecretSize {
				return fmt.Errorf("--secret %s: larger than %s", s.Name, FormatSize(MaxSecretSize))
			}
			if strings.IndexByte(string(s.Value), 0) >= 0 {
				return fmt.Errorf("--secret %s: contains a NUL byte (it must fit in an environment variable)", s.Name)
			}
		}
		return nil
	}},
}
