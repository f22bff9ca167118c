package shim

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// emptyFile is an empty read-only file in the pod's state directory,
// bound over the masked files of the pod's containers.
func (p *pod) emptyFile() (string, error) {
	path := filepath.Join(p.stateDir, "masked-empty")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o444)
	if errors.Is(err, fs.ErrExist) {
		return path, nil
	}
	if err != nil {
		return "", err
	}
	return path, f.Close()
}
