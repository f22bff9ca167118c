package assembly

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/containerd/errdefs"
)

// FindRunsc locates the runsc binary both front ends drive: $HUTCH_RUNSC,
// then "runsc" beside the running executable (hutch's bin/, or the shim's
// directory on a node), then $PATH.
func FindRunsc() (string, error) {
	if p := os.Getenv("HUTCH_RUNSC"); p != "" {
		return CheckRunsc(p)
	}
	if exe, err := os.Executable(); err == nil {
		if r, err := filepath.EvalSymlinks(exe); err == nil {
			exe = r
		}
		if p, err := CheckRunsc(filepath.Join(filepath.Dir(exe), "runsc")); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("runsc")
	if err != nil {
		return "", fmt.Errorf("runsc not found beside %s, in $HUTCH_RUNSC or on $PATH (run `make`, or name it): %w", filepath.Base(os.Args[0]), errdefs.ErrNotFound)
	}
	return p, nil
}

// CheckRunsc checks that p names an executable file and returns its
// absolute path.
func CheckRunsc(p string) (string, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("runsc %q: %w: %w", p, errdefs.ErrNotFound, err)
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("runsc %q is not an executable file: %w", p, errdefs.ErrInvalidArgument)
	}
	// Absolute: hutch's detached processes (a pause's end, a pool's
	// filler, a forwarder) are given it and run in another directory.
	return filepath.Abs(p)
}
