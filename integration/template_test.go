package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hutch.dev/hutch/client"
)

// templateDockerfile is a template on the busybox test image, set by
// labels: its start command notes that it ran, prints a random token,
// and serves it over HTTP after a second.
const templateDockerfile = `FROM busybox
RUN mkdir -p /www && echo %s > /www/version
LABEL dev.hutch.template.start="echo started >> /tmp/starts; head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /www/token; echo token \$(cat /www/token); sleep 1; exec httpd -f -p 8000 -h /www"
LABEL dev.hutch.template.ready="port:8000"
`

// templateOf is the template part of a sandbox's inspect.
type templateOf struct {
	Template *struct {
		Warm       bool   `json:"warm"`
		Checkpoint string `json:"checkpoint"`
		Reason     string `json:"reason"`
		Built      bool   `json:"built"`
	} `json:"template"`
}

// A template starts warm: every sandbox of it is restored from the moment
// its start command was ready, so its server answers at once, on the
// first try, and the command ran once (at build), not per sandbox. Each
// sandbox has its own hostname, machine ID and environment. A sandbox the
// checkpoint cannot serve boots cold with the start command, and says
// why. A changed image makes a new checkpoint at its next use and drops
// the old; a template whose ready check never passes fails its build with
// the check's output and leaves nothing.
func TestTemplateWarm(t *testing.T) {
	e := newEnv(t)
	e.ok("image", "import", "busybox", filepath.Join(e.bin, "images", "busybox.tar"))
	ctxDir := writeContext(t, map[string]string{"Dockerfile": fmt.Sprintf(templateDockerfile, "one")})
	e.ok("image", "build", "--progress", "quiet", "-t", "tpl", ctxDir)

	type seen struct{ hostname, machineID, env, starts, token string }
	look := func(id string) seen {
		t.Helper()
		// The first request, right after create, with no retry: a cold
		// sandbox's server listens only a second after its start.
		out := e.ok("exec", id, "--", "sh", "-c", `hostname; cat /etc/machine-id; echo "$WHO"; wc -l < /tmp/starts; wget -qO- http://127.0.0.1:8000/token`)
		f := strings.Split(strings.TrimSpace(out), "\n")
		if len(f) != 5 {
			t.Fatalf("sandbox %s printed %q, want hostname, machine ID, $WHO, starts and the token", id, out)
		}
		return seen{f[0], f[1], f[2], strings.TrimSpace(f[3]), f[4]}
	}
	warm := func(id string) string {
		t.Helper()
		var r templateOf
		e.inspectInto(id, &r)
		if r.Template == nil || !r.Template.Warm {
			t.Fatalf("sandbox %s: template %+v, want restored from the template's checkpoint", id, r.Template)
		}
		return r.Template.Checkpoint
	}

	a := e.create("--image", "tpl", "--env", "WHO=a")
	b := e.create("--image", "tpl", "--env", "WHO=b", "--net", "open")
	sa, sb := look(a), look(b)
	t.Run("the server answers at once and its command ran once, at build", func(t *testing.T) {
		if sa.starts != "1" || sb.starts != "1" {
			t.Errorf("/tmp/starts has %s and %s lines, want 1: the start command ran in the sandbox, not once at build", sa.starts, sb.starts)
		}
		if len(sa.token) != 16 || len(sb.token) != 16 {
			t.Errorf("tokens %q and %q, want 16 hex digits", sa.token, sb.token)
		}
		warm(a)
		warm(b)
	})
	t.Run("each sandbox has its own hostname, machine ID and environment", func(t *testing.T) {
		if sa.hostname != a[:12] || sb.hostname != b[:12] {
			t.Errorf("hostnames %q and %q, want the sandboxes' short IDs %s and %s", sa.hostname, sb.hostname, a[:12], b[:12])
		}
		if sa.machineID == sb.machineID || len(sa.machineID) != 32 {
			t.Errorf("machine IDs %q and %q, want two different ones of 32 hex digits", sa.machineID, sb.machineID)
		}
		if sa.env != "a" || sb.env != "b" {
			t.Errorf("$WHO %q and %q, want each create's own", sa.env, sb.env)
		}
	})
	t.Run("a sandbox with network has its own address", func(t *testing.T) {
		var r sandboxRecord
		e.inspectInto(b, &r)
		out := e.ok("exec", b, "--", "ip", "-4", "addr", "show", "eth0")
		if r.IP == "" || !strings.Contains(out, r.IP+"/") {
			t.Errorf("sandbox %s, address %q, has eth0:\n%s", b, r.IP, out)
		}
	})

	t.Run("a create the checkpoint cannot serve boots cold and says why", func(t *testing.T) {
		dir := t.TempDir()
		c := e.create("--image", "tpl", "-v", dir+":/mnt")
		var r templateOf
		e.inspectInto(c, &r)
		if r.Template == nil || r.Template.Warm || !strings.Contains(r.Template.Reason, "volumes") {
			t.Fatalf("a create with a volume: template %+v, want cold, saying the volume is why", r.Template)
		}
		s := look(c)
		if s.starts != "1" || s.token == sa.token {
			t.Errorf("cold sandbox: starts %s, token %q (the checkpoint's %q): want its own start", s.starts, s.token, sa.token)
		}
	})

	token := sa.token
	t.Run("a changed image makes a new checkpoint at its next use and drops the old", func(t *testing.T) {
		first := warm(a)
		if err := os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte(fmt.Sprintf(templateDockerfile, "two")), 0o644); err != nil {
			t.Fatal(err)
		}
		e.ok("image", "build", "--progress", "quiet", "-t", "tpl", ctxDir)
		c := e.create("--image", "tpl")
		if ck := warm(c); ck == first {
			t.Fatalf("the changed image's sandbox was restored from the old checkpoint %s", ck)
		}
		if v := e.ok("exec", c, "--", "cat", "/www/version"); v != "two\n" {
			t.Errorf("the new sandbox has version %q, want two", v)
		}
		s := look(c)
		if s.token == sa.token {
			t.Errorf("the changed image's sandbox serves the old token %q", s.token)
		}
		token = s.token
		if _, err := os.Stat(filepath.Join(e.root, "images", "checkpoints", strings.TrimPrefix(first, "sha256:"))); err == nil {
			t.Errorf("the old version's checkpoint %s is still stored", first)
		}
	})

	t.Run("a ready check that never passes fails the build with its output and leaves nothing", func(t *testing.T) {
		before := checkpointsOf(t, e)
		bad := writeContext(t, map[string]string{"Dockerfile": "FROM busybox\n"})
		r := e.run(nil, "image", "build", "--progress", "quiet", "-t", "never", "--start-cmd", "echo warming up; sleep 600",
			"--ready-cmd", "cmd:echo not yet >&2; false", "--ready-timeout", "2s", bad)
		if r.code != 125 {
			t.Fatalf("build of a template that never gets ready: %s, want exit 125", r)
		}
		for _, want := range []string{"did not pass within 2s", "not yet", "warming up", "is not kept"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("the error does not say %q:\n%s", want, r.stderr)
			}
		}
		if out := e.ok("image", "ls"); strings.Contains(out, "never") {
			t.Errorf("the image of the failed template is still listed:\n%s", out)
		}
		if after := checkpointsOf(t, e); after != before {
			t.Errorf("checkpoints before the failed build: %d, after: %d", before, after)
		}
		var all []struct {
			Image string `json:"image"`
		}
		if err := json.Unmarshal([]byte(e.ok("ls", "--format", "json")), &all); err != nil {
			t.Fatal(err)
		}
		for _, s := range all {
			if strings.HasPrefix(s.Image, "never") || strings.HasPrefix(s.Image, "busybox") {
				t.Errorf("the failed build left a sandbox of %s", s.Image)
			}
		}
	})
	t.Run("through hutch serve: each sandbox of the template has its own tokens", func(t *testing.T) {
		// The server's root is e's: its clean-up removes e's sandboxes.
		srv := newServer(t, e.root)
		key := srv.tenantAdd("tpl")
		srv.serve()
		defer srv.stop()
		c := &client.Client{APIURL: srv.url(""), APIKey: key}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var tokens []string
		for range 2 {
			sbx, err := c.Create(ctx, client.CreateRequest{TemplateID: "tpl", Timeout: 300})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Kill(context.Background(), sbx.ID) //nolint:errcheck // the root's clean-up removes it too
			warm(sbx.ID)
			tokens = append(tokens, sbx.AccessToken)
			var out strings.Builder
			cmd, err := sbx.Start(ctx, client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", "wget -qO- http://127.0.0.1:8000/token"}, Stdout: &out})
			if err != nil {
				t.Fatal(err)
			}
			if res, err := cmd.Wait(ctx); err != nil || res.ExitCode != 0 || out.String() != token {
				t.Fatalf("the template's server through the API: %v %+v %q", err, res, out.String())
			}
		}
		if tokens[0] == "" || tokens[0] == tokens[1] {
			t.Errorf("envd access tokens %q and %q, want two different ones", tokens[0], tokens[1])
		}
	})

}

// checkpointsOf counts the memory checkpoints in e's store.
func checkpointsOf(t *testing.T, e *env) int {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(e.root, "images", "checkpoints"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	n := 0
	for _, ent := range ents {
		if ent.IsDir() && !strings.HasPrefix(ent.Name(), ".") {
			n++
		}
	}
	return n
}

// The E2B SDK's Template builder builds a template through hutch serve
// with every kind of step and a start command, and sandboxes of it start
// with the command running; a failing step gives its log; another tenant
// cannot see or use it.
func TestServeTemplateBuild(t *testing.T) {
	requiresRoot(t)
	requireSDK(t)
	base := baseArchive(t)
	s := newServer(t, base)
	key := s.tenantAdd("builder")
	other := s.tenantAdd("other")
	s.serve()
	s.runScript(t, "build.mjs", key, map[string]string{"E2B_API_KEY_OTHER": other}, 15*time.Minute)
	// The builds' BuildKit stays up a while for the next build.
	s.stopBuilder()
	s.stopAndCheckClean()
}
