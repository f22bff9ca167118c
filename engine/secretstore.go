package engine

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/policy"
)

// The host's secret store holds the values the egress gateway injects
// into a sandbox's requests (CreateRequest.Inject): one file per secret,
// mode 0600, in a directory only the state root's owner can read. No
// value is ever inside a sandbox, printed or logged.

// MaxSecretSize bounds one secret's value.
const MaxSecretSize = 64 << 10

// SecretInfo is what is shown of a stored secret: never its value.
type SecretInfo struct {
	Name     string    `json:"name"`
	Size     int64     `json:"size"`
	Modified time.Time `json:"modified"`
}

// secretStore is the store's directory.
func (e *Engine) secretStore() string { return filepath.Join(e.opts.Root, "egress-secrets") }

// AddSecret stores value as the secret name, replacing one of that name.
func (e *Engine) AddSecret(name string, value []byte) error {
	if err := policy.CheckSecretName(name); err != nil {
		return err
	}
	switch {
	case len(value) == 0:
		return fmt.Errorf("secret %s: empty value: %w", name, errdefs.ErrInvalidArgument)
	case len(value) > MaxSecretSize:
		return fmt.Errorf("secret %s: %d bytes, more than %d: %w", name, len(value), MaxSecretSize, errdefs.ErrInvalidArgument)
	}
	dir := e.secretStore()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".add-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(value); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), filepath.Join(dir, name))
}

// Secrets lists the stored secrets, by name.
func (e *Engine) Secrets() ([]SecretInfo, error) {
	ents, err := os.ReadDir(e.secretStore())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []SecretInfo
	for _, d := range ents {
		if policy.CheckSecretName(d.Name()) != nil || !d.Type().IsRegular() {
			continue
		}
		fi, err := d.Info()
		if err != nil {
			continue
		}
		out = append(out, SecretInfo{Name: d.Name(), Size: fi.Size(), Modified: fi.ModTime().UTC()})
	}
	slices.SortFunc(out, func(a, b SecretInfo) int { return cmpString(a.Name, b.Name) })
	return out, nil
}

// RemoveSecret deletes the secret name. A sandbox whose inject rule names
// it gets a refusal from its gateway from then on.
func (e *Engine) RemoveSecret(name string) error {
	if err := policy.CheckSecretName(name); err != nil {
		return err
	}
	err := os.Remove(filepath.Join(e.secretStore(), name))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("no secret %s: %w", name, errdefs.ErrNotFound)
	}
	return err
}

// checkSecretsStored fails unless every secret rules name is stored.
func (e *Engine) checkSecretsStored(rules []policy.InjectRule) error {
	for _, r := range rules {
		for _, n := range r.SecretRefs() {
			if fi, err := os.Stat(filepath.Join(e.secretStore(), n)); err != nil || !fi.Mode().IsRegular() {
				return fmt.Errorf("--inject %s: no secret %s in the store (hutch secret add %s): %w", r.Host, n, n, errdefs.ErrNotFound)
			}
		}
	}
	return nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
