package integration

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/creack/pty"
)

// `e2b sandbox connect` (the pinned E2B CLI) against hutch serve, on a
// real pty the test holds as a person's terminal: the CLI opens a
// terminal in the sandbox, a command typed there runs in it, the
// sandbox's terminal has the caller's size and follows its resize, and
// `exit` ends the CLI with the caller's terminal given back in its modes
// and the sandbox still running.
func TestServeE2BCLIConnect(t *testing.T) {
	requiresRoot(t)
	requireSDK(t)
	if _, err := os.Stat(e2bCLI); err != nil {
		t.Fatalf("the E2B CLI is not installed in integration/e2b-cli (run `make e2b-cli`): %v", err)
	}
	s := newServer(t, baseArchive(t))
	key := s.tenantAdd("cli")
	s.serve()
	sb := s.createSandbox(key, "base")

	c := exec.Command(e2bCLI, "sandbox", "connect", sb.SandboxID)
	c.Env = append(withoutEnv(os.Environ(), "E2B_"), "E2B_API_KEY="+key, "E2B_API_URL="+s.url(""),
		"E2B_SANDBOX_URL="+s.url(""), "E2B_DOMAIN="+serveDomain, "TERM=xterm")
	tm := runOnTerm(t, c, 30, 100, nil)
	tm.send("echo conn-$((6*7)) $(id -un) $(hostname) && stty size\r")
	tm.expect("conn-42 user")
	tm.expect("30 100")
	if err := pty.Setsize(tm.ptmx, &pty.Winsize{Rows: 41, Cols: 127}); err != nil {
		t.Fatal(err)
	}
	// The CLI passes the resize on when it gets SIGWINCH; a command
	// typed after it sees the new size.
	tm.send("sleep 1; stty size\r")
	tm.expect("41 127")
	tm.send("exit\r")
	if code := tm.wait(); code != 0 {
		t.Errorf("e2b sandbox connect exited %d after exit in the sandbox; terminal shows:\n%s", code, tm.out.String())
	}
	tm.assertCooked()
	r := s.do("GET", "/sandboxes/"+sb.SandboxID, nil, map[string]string{"X-API-Key": key})
	if r.status != 200 || !strings.Contains(r.body, sb.SandboxID) {
		t.Errorf("the sandbox is gone after connect ended: %s", r)
	}
	s.deleteAllThroughAPI(key)
	s.stopAndCheckClean()
}
