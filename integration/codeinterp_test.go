package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// codeDir holds the code-interpreter SDK scripts and their pinned
// node_modules (make code-interpreter-sdk).
const codeDir = "code-interpreter"

// requireCodeInterpreter fails unless the code-interpreter-v1 image
// (make code-interpreter-image) and the pinned @e2b/code-interpreter SDK
// (make code-interpreter-sdk) are there; it returns the image's archive.
func requireCodeInterpreter(t *testing.T) string {
	t.Helper()
	requireSDK(t)
	var pkg struct {
		Version string `json:"version"`
	}
	b, err := os.ReadFile(filepath.Join(codeDir, "node_modules", "@e2b", "code-interpreter", "package.json"))
	if err == nil {
		err = json.Unmarshal(b, &pkg)
	}
	if err != nil {
		t.Fatalf("@e2b/code-interpreter is not installed in integration/%s (run `make code-interpreter-sdk`): %v", codeDir, err)
	}
	archive := filepath.Join(binDir(t), "images", "code-interpreter-v1.tar")
	if _, err := os.Stat(archive); err != nil {
		t.Fatalf("the code-interpreter-v1 image is not built (run `make code-interpreter-image`): %v", err)
	}
	t.Logf("@e2b/code-interpreter %s, image %s", pkg.Version, archive)
	return archive
}

// sharedCode is the state root in which code-interpreter-v1 is imported
// once per test process, by the first test that needs it, and its
// checkpoint made by a first create; the code interpreter's tests share
// it. TestMain removes it, with what is left in it.
var sharedCode struct {
	once sync.Once
	dir  string
	err  error
}

// removeCodeRoot removes sharedCode's root and every sandbox left in it.
func removeCodeRoot() {
	if sharedCode.dir == "" {
		return
	}
	hutch := filepath.Join(os.Getenv("HUTCH_BIN"), "hutch")
	out, _ := exec.Command(hutch, "--root", sharedCode.dir, "ls", "-q").Output()
	for _, id := range strings.Fields(string(out)) {
		exec.Command(hutch, "--root", sharedCode.dir, "rm", "-f", id).Run() //nolint:errcheck // best effort at exit
	}
	os.RemoveAll(sharedCode.dir)
}

// codeRoot is that state root.
func codeRoot(t *testing.T) string {
	t.Helper()
	archive := requireCodeInterpreter(t)
	sharedCode.once.Do(func() {
		if sharedCode.dir, sharedCode.err = os.MkdirTemp("", "hutch-code-root-"); sharedCode.err != nil {
			return
		}
		e := &env{t: t, bin: binDir(t), root: sharedCode.dir}
		start := time.Now()
		if r := e.run(nil, "image", "import", "code-interpreter-v1", archive); r.code != 0 {
			sharedCode.err = fmt.Errorf("importing %s: %s", archive, r)
			return
		}
		imported := time.Since(start)
		// The first create after the import makes the template's
		// checkpoint: the server started, its kernels up.
		r := e.run(nil, "create", "--image", "code-interpreter-v1")
		if r.code != 0 {
			sharedCode.err = fmt.Errorf("the first sandbox of code-interpreter-v1: %s", r)
			return
		}
		e.run(nil, "rm", "-f", strings.TrimSpace(r.stdout))
		t.Logf("code-interpreter-v1 imported in %s, its checkpoint made in %s", imported.Round(time.Millisecond), (time.Since(start) - imported).Round(time.Millisecond))
	})
	if sharedCode.err != nil {
		t.Fatal(sharedCode.err)
	}
	return sharedCode.dir
}

// E2B's code-interpreter SDK runs unchanged against hutch serve over TLS,
// set up with only E2B_API_KEY and E2B_DOMAIN: every item of what it must
// show (sdk.mjs names each check). The sandboxes are restored warm from
// the template, the server and its default kernels already running.
func TestServeCodeInterpreter(t *testing.T) {
	requiresRoot(t)
	root := codeRoot(t)
	s, key, other := serveOverTLS(t, root, "code")

	id := s.runScriptIn(t, codeDir, "sdk.mjs", key, map[string]string{"HUTCH_OTHER_KEY": other}, 15*time.Minute)
	if id == "" {
		t.Fatal("sdk.mjs made no sandbox")
	}
	t.Run("the sandbox was restored from the template's checkpoint", func(t *testing.T) {
		var r templateOf
		s.inspectInto(id, &r)
		if r.Template == nil || !r.Template.Warm {
			t.Fatalf("sandbox %s: template %+v, want restored warm", id, r.Template)
		}
	})
}

// hutch code runs code in a sandbox's contexts from the command line: the
// default context of each language keeps its state between calls, a
// context of its own (code-context create) has its cwd and can be
// listed, restarted and removed, figures are saved as files, an
// exception exits 1 with its traceback, and bad input exits 125.
func TestCodeCLI(t *testing.T) {
	e := newEnv(t)
	e.root = codeRoot(t)
	id := e.create("--image", "code-interpreter-v1")
	t.Cleanup(func() { e.run(nil, "rm", "-f", id) })

	t.Run("python keeps its state between calls", func(t *testing.T) {
		e.ok("code", id, "-l", "python", "x = 6")
		if out := e.ok("code", id, "print(x * 7)"); out != "42\n" {
			t.Fatalf("print(x * 7): %q, want 42", out)
		}
		if out := e.ok("code", id, "x + 1"); out != "7\n" {
			t.Fatalf("x + 1: %q, want its value, 7", out)
		}
	})
	t.Run("javascript, typescript and bash keep theirs", func(t *testing.T) {
		e.ok("code", id, "-l", "js", "let n = 20")
		if out := e.ok("code", id, "-l", "javascript", "n * 2 + 2"); out != "42\n" {
			t.Errorf("javascript: %q", out)
		}
		if out := e.ok("code", id, "-l", "ts", "const k: number = 5; k * 2"); out != "10\n" {
			t.Errorf("typescript: %q", out)
		}
		e.ok("code", id, "-l", "bash", "V=kept; cd /tmp")
		if out := e.ok("code", id, "-l", "bash", "echo $V $(pwd)"); out != "kept /tmp\n" {
			t.Errorf("bash: %q", out)
		}
	})
	t.Run("an exception exits 1 with its traceback", func(t *testing.T) {
		r := e.run(nil, "code", id, "{}['missing']")
		if r.code != 1 || !strings.Contains(r.stderr, "KeyError") || !strings.Contains(r.stderr, "'missing'") {
			t.Fatalf("an exception: %s, want exit 1 and the KeyError", r)
		}
	})
	t.Run("a figure is saved as a PNG with its chart", func(t *testing.T) {
		dir := t.TempDir()
		r := e.run(nil, "code", id, "--save", dir, "import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4])\nplt.show()")
		if r.code != 0 {
			t.Fatalf("plot: %s", r)
		}
		png, err := os.ReadFile(filepath.Join(dir, "result-1.png"))
		if err != nil || len(png) < 8 || string(png[1:4]) != "PNG" {
			t.Fatalf("result-1.png: %v (%d bytes)\n%s", err, len(png), r)
		}
		var chart struct {
			Type     string `json:"type"`
			Elements []struct {
				Points [][]float64 `json:"points"`
			} `json:"elements"`
		}
		b, err := os.ReadFile(filepath.Join(dir, "result-1.chart.json"))
		if err == nil {
			err = json.Unmarshal(b, &chart)
		}
		if err != nil || chart.Type != "line" || len(chart.Elements) != 1 || fmt.Sprint(chart.Elements[0].Points) != "[[1 3] [2 4]]" {
			t.Fatalf("result-1.chart.json: %v: %s", err, b)
		}
	})
	t.Run("code-context create, ls, restart and rm", func(t *testing.T) {
		cid := strings.TrimSpace(e.ok("code-context", "create", "--cwd", "/tmp", id))
		if out := e.ok("code", id, "--context", cid, "import os\ny = 1\nos.getcwd()"); out != "/tmp\n" {
			t.Fatalf("cwd of the context: %q", out)
		}
		var cs []struct{ ID, Language, Cwd string }
		if err := json.Unmarshal([]byte(e.ok("code-context", "ls", "--format", "json", id)), &cs); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, c := range cs {
			found = found || (c.ID == cid && c.Language == "python" && c.Cwd == "/tmp")
		}
		if !found {
			t.Fatalf("code-context ls: %+v, want %s in /tmp", cs, cid)
		}
		e.ok("code-context", "restart", id, cid)
		if r := e.run(nil, "code", id, "--context", cid, "y"); r.code != 1 || !strings.Contains(r.stderr, "NameError") {
			t.Fatalf("y after restart: %s, want a NameError", r)
		}
		e.ok("code-context", "rm", id, cid)
		if r := e.run(nil, "code", id, "--context", cid, "1"); r.code != 125 || !strings.Contains(r.stderr, "not found") {
			t.Fatalf("a removed context: %s, want exit 125, not found", r)
		}
	})
	t.Run("bad input exits 125 and says what was wrong", func(t *testing.T) {
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"code", id, "-l", "cobol", "x"}, "--language"},
			{[]string{"code", id, "-l", "python", "--context", "abc", "x"}, "give one"},
			{[]string{"code", "no-such-sandbox", "1"}, "no-such-sandbox"},
			{[]string{"code-context", "create", "--cwd", "/no/such/dir", id}, "/no/such/dir"},
		} {
			if r := e.run(nil, c.args...); r.code != 125 || !strings.Contains(r.stderr, c.want) {
				t.Errorf("hutch %s: %s, want exit 125 saying %q", strings.Join(c.args, " "), r, c.want)
			}
		}
		b := e.create("--image", "busybox")
		defer e.run(nil, "rm", "-f", b)
		if r := e.run(nil, "code", b, "1"); r.code != 125 || !strings.Contains(r.stderr, "code-interpreter-v1") {
			t.Errorf("hutch code in a busybox sandbox: %s, want exit 125 naming code-interpreter-v1", r)
		}
	})
}

// Through MCP (the Go SDK's client over stdio): run_code keeps an agent's
// variables between calls in a sandbox of code-interpreter-v1, returns a
// figure as image content and a DataFrame as a text table, and runs in
// contexts create_code_context makes and restart_code_context empties.
func TestMCPCodeInterpreter(t *testing.T) {
	e := newEnv(t)
	e.root = codeRoot(t)
	cs := mcpServe(t, e)
	var sb mcpSandbox
	mustCall(t, cs, "create_sandbox", map[string]any{"image": "code-interpreter-v1"}, &sb)
	t.Cleanup(func() { e.run(nil, "rm", "-f", sb.SandboxID) })
	id := sb.SandboxID

	type codeRun struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
		Stateful bool   `json:"stateful"`
		Results  []struct {
			Text    string   `json:"text"`
			Formats []string `json:"formats"`
			Main    bool     `json:"main"`
		} `json:"results"`
		Error *struct{ Name, Value string } `json:"error"`
	}
	var r codeRun
	t.Run("variables last between run_code calls", func(t *testing.T) {
		mustCall(t, cs, "run_code", map[string]any{"sandbox_id": id, "code": "total = sum(range(10))"}, &r)
		if !r.Stateful || r.ExitCode != 0 {
			t.Fatalf("run_code: %+v, want stateful", r)
		}
		mustCall(t, cs, "run_code", map[string]any{"sandbox_id": id, "language": "python", "code": "print('total is', total)\ntotal * 2"}, &r)
		if r.Stdout != "total is 45\n" || len(r.Results) != 1 || r.Results[0].Text != "90" || !r.Results[0].Main {
			t.Fatalf("the next run_code: %+v", r)
		}
		mustCall(t, cs, "run_code", map[string]any{"sandbox_id": id, "language": "javascript", "code": "var seen = 3"}, nil)
		mustCall(t, cs, "run_code", map[string]any{"sandbox_id": id, "language": "node", "code": "seen + 1"}, &r)
		if len(r.Results) != 1 || r.Results[0].Text != "4" {
			t.Fatalf("javascript state: %+v", r)
		}
	})
	t.Run("a figure comes back as an image", func(t *testing.T) {
		res := mustCall(t, cs, "run_code", map[string]any{"sandbox_id": id, "code": "import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [1, 2])\nplt.show()"}, &r)
		var img *sdk.ImageContent
		for _, c := range res.Content {
			if ic, ok := c.(*sdk.ImageContent); ok {
				img = ic
			}
		}
		if img == nil || img.MIMEType != "image/png" || len(img.Data) < 8 || string(img.Data[1:4]) != "PNG" {
			t.Fatalf("the figure's content: %+v (%s)", res.Content, toolText(res))
		}
		if len(r.Results) != 1 || !strings.Contains(strings.Join(r.Results[0].Formats, ","), "chart") {
			t.Fatalf("the figure's result: %+v", r)
		}
	})
	t.Run("a DataFrame comes back as a text table", func(t *testing.T) {
		res := mustCall(t, cs, "run_code", map[string]any{"sandbox_id": id, "code": "import pandas as pd\npd.DataFrame({'name': ['ann', 'bob'], 'age': [31, 42]})"}, &r)
		text := toolText(res)
		for _, want := range []string{"name", "age", "ann", "42", "data"} {
			if !strings.Contains(text, want) {
				t.Fatalf("the DataFrame's text lacks %q:\n%s", want, text)
			}
		}
	})
	t.Run("create_code_context and restart_code_context", func(t *testing.T) {
		var c struct {
			ContextID string `json:"context_id"`
			Cwd       string `json:"cwd"`
		}
		mustCall(t, cs, "create_code_context", map[string]any{"sandbox_id": id, "cwd": "/tmp"}, &c)
		mustCall(t, cs, "run_code", map[string]any{"sandbox_id": id, "context_id": c.ContextID, "code": "import os\nmine = 1\nos.getcwd()"}, &r)
		if len(r.Results) != 1 || r.Results[0].Text != "/tmp" {
			t.Fatalf("in the new context: %+v", r)
		}
		mustCall(t, cs, "run_code", map[string]any{"sandbox_id": id, "code": "'mine' in dir()"}, &r)
		if len(r.Results) != 1 || r.Results[0].Text != "False" {
			t.Fatalf("the default context sees the new one's variable: %+v", r)
		}
		mustCall(t, cs, "restart_code_context", map[string]any{"sandbox_id": id, "context_id": c.ContextID}, nil)
		mustCall(t, cs, "run_code", map[string]any{"sandbox_id": id, "context_id": c.ContextID, "code": "mine"}, &r)
		if r.ExitCode != 1 || r.Error == nil || r.Error.Name != "NameError" {
			t.Fatalf("after restart: %+v, want a NameError", r)
		}
		wantToolError(t, cs, "restart_code_context", map[string]any{"sandbox_id": id, "context_id": "nope"}, "no code context")
		wantToolError(t, cs, "run_code", map[string]any{"sandbox_id": id, "language": "cobol", "code": "x"}, "language")
	})
}
