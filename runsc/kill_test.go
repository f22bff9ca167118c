package runsc

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"
)

// fakeRunsc is a runsc that fails every command with msg on stderr and
// exit status 1, as runsc does.
func fakeRunsc(t *testing.T, msg string) *Runsc {
	t.Helper()
	path := filepath.Join(t.TempDir(), "runsc")
	script := "#!/bin/sh\nprintf '%s\\n' '" + msg + "' >&2\nexit 1\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return &Runsc{Path: path, Root: t.TempDir()}
}

// A kill that comes after its process exited is NotFound, as containerd's
// runc shim answers it; any other failure of a kill is not.
func TestKillAfterExitIsNotFound(t *testing.T) {
	for _, tc := range []struct {
		stderr string
		gone   bool
	}{
		{`signaling process in container "c1" PID 0: no such process`, true},
		{`failed to signal pid 7: no such process with PID 7`, true},
		{`sandbox is not running`, true},
		{`W1130 07:00:00.000000 1 util.go:64] FATAL ERROR: signaling process in container "c1" PID 0: no such process`, true},
		{`loading container: permission denied`, false},
		{`unknown signal "99"`, false},
	} {
		r := fakeRunsc(t, tc.stderr)
		err := r.Kill(context.Background(), "c1", syscall.SIGTERM, KillOpts{})
		if err == nil {
			t.Fatalf("%q: kill succeeded", tc.stderr)
		}
		if got := errdefs.IsNotFound(err); got != tc.gone {
			t.Errorf("%q: NotFound = %v, want %v (err %v)", tc.stderr, got, tc.gone, err)
		}
		if got := errors.Is(err, ErrProcessGone); got != tc.gone {
			t.Errorf("%q: ErrProcessGone = %v, want %v", tc.stderr, got, tc.gone)
		}
		var re *Error
		if !errors.As(err, &re) || re.Sub != "kill" || re.Status != 1 {
			t.Errorf("%q: not a runsc kill error with its status: %#v", tc.stderr, err)
		}
	}
}

// Only a kill is read this way: "no such process" from another command
// is that command's failure, not a finished process.
func TestOnlyKillIsProcessGone(t *testing.T) {
	r := fakeRunsc(t, "waiting for PID 3: no such process")
	if _, err := r.run(context.Background(), "wait", "c1"); err == nil || errdefs.IsNotFound(err) {
		t.Fatalf("runsc wait: %v, want a failure that is not NotFound", err)
	}
}
