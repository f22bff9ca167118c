package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// e2bCLI is the pinned E2B CLI (`make e2b-cli`).
const e2bCLI = "e2b-cli/node_modules/.bin/e2b"

// E2B's own CLI against hutch serve: it lists a sandbox, shows it, runs a
// command in it, lists the templates, builds a template from a Dockerfile
// with a start and a ready command (through the template build calls),
// and kills a sandbox.
func TestServeE2BCLI(t *testing.T) {
	requiresRoot(t)
	requireSDK(t)
	if _, err := os.Stat(e2bCLI); err != nil {
		t.Fatalf("the E2B CLI is not installed in integration/e2b-cli (run `make e2b-cli`): %v", err)
	}
	s := newServer(t, baseArchive(t))
	key := s.tenantAdd("cli")
	s.serve()
	cli := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		c := exec.CommandContext(ctx, e2bCLI, args...)
		c.Env = append(withoutEnv(os.Environ(), "E2B_"), "E2B_API_KEY="+key, "E2B_API_URL="+s.url(""), "E2B_SANDBOX_URL="+s.url(""), "E2B_DOMAIN="+serveDomain)
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("e2b %s: %v\n%s\nserver log:\n%s", strings.Join(args, " "), err, out, s.logTail(15))
		}
		return string(out)
	}
	sb := s.createSandbox(key, "base")
	if out := cli("sandbox", "list"); !strings.Contains(out, sb.SandboxID) {
		t.Errorf("e2b sandbox list does not show %s:\n%s", sb.SandboxID, out)
	}
	if out := cli("sandbox", "info", sb.SandboxID); !strings.Contains(out, sb.SandboxID) {
		t.Errorf("e2b sandbox info:\n%s", out)
	}
	if out := cli("sandbox", "exec", sb.SandboxID, "--", "echo", "hi-from-the-cli"); !strings.Contains(out, "hi-from-the-cli") {
		t.Errorf("e2b sandbox exec:\n%s", out)
	}
	if out := cli("template", "list"); !strings.Contains(out, "base") {
		t.Errorf("e2b template list does not show base:\n%s", out)
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "e2b.Dockerfile"), []byte("FROM e2bdev/base\nRUN echo built-by-the-cli > /home/user/cli.txt\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := cli("template", "create", "cli-tpl", "--path", dir, "--cmd", "cd /home/user && exec python3 -m http.server 8000", "--ready-cmd", "curl -sf http://127.0.0.1:8000/ >/dev/null")
	t.Logf("e2b template create:\n%s", out)
	built := s.createSandbox(key, "cli-tpl")
	if out := cli("sandbox", "exec", built.SandboxID, "--", "sh", "-c", "cat /home/user/cli.txt; curl -s http://127.0.0.1:8000/cli.txt"); out != "built-by-the-cli\nbuilt-by-the-cli\n" {
		t.Errorf("a sandbox of the CLI's template:\n%q, want its file, and its server already serving it", out)
	}

	if out := cli("sandbox", "kill", sb.SandboxID); !strings.Contains(out, "killed") {
		t.Errorf("e2b sandbox kill:\n%s", out)
	}
	if out := cli("sandbox", "list"); strings.Contains(out, sb.SandboxID) {
		t.Errorf("the killed sandbox is still listed:\n%s", out)
	}
	s.deleteAllThroughAPI(key)
	s.stopBuilder()
	s.stopAndCheckClean()
}
