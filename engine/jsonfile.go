package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/containerd/errdefs"
)

// readJSON decodes the JSON file at path into v. A missing file is an
// errdefs.ErrNotFound error that says missing; one that does not decode
// is an error that says corrupt. Any other error is the read's.
func readJSON(path string, v any, missing, corrupt string) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: %w", missing, errdefs.ErrNotFound)
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", corrupt, err)
	}
	return nil
}

// writeJSON writes v to path atomically, owner-only.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
