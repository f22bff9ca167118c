package completion_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands"
)

// want is what the CLI defines at one command: the words that complete
// after it (subcommands and their aliases) and its flags as typed.
type want struct {
	path  []string
	subs  []string
	flags []string
}

// definitions walks the app's own commands and flags, as urfave/cli runs
// them: hidden ones left out, --help everywhere, help and --version at
// the root.
func definitions(app *cli.App) []want {
	var out []want
	spell := func(fs []cli.Flag) []string {
		seen := map[string]bool{"--help": true, "-h": true}
		names := []string{"--help", "-h"}
		for _, f := range fs {
			if v, ok := f.(cli.VisibleFlag); ok && !v.IsVisible() {
				continue
			}
			for _, n := range f.Names() {
				s := "--" + n
				if len(n) == 1 {
					s = "-" + n
				}
				if !seen[s] {
					seen[s] = true
					names = append(names, s)
				}
			}
		}
		sort.Strings(names)
		return names
	}
	var walk func(path []string, cmds []*cli.Command, fs []cli.Flag)
	walk = func(path []string, cmds []*cli.Command, fs []cli.Flag) {
		w := want{path: path, flags: spell(fs)}
		for _, c := range cmds {
			if !c.Hidden && (c.Name != "help" || len(path) == 0) {
				w.subs = append(w.subs, c.Name)
				w.subs = append(w.subs, c.Aliases...)
			}
		}
		if len(path) == 0 && !slices.Contains(w.subs, "help") {
			w.subs = append(w.subs, "help", "h")
			w.flags = append(w.flags, "--version")
			sort.Strings(w.flags)
		}
		sort.Strings(w.subs)
		out = append(out, w)
		for _, c := range cmds {
			if !c.Hidden && c.Name != "help" {
				walk(append(slices.Clone(path), c.Name), c.Subcommands, c.Flags)
			}
		}
	}
	walk(nil, app.Commands, app.Flags)
	return out
}

func script(t *testing.T, shell string) string {
	t.Helper()
	app := commands.App()
	var out bytes.Buffer
	app.Writer = &out
	if err := app.Run([]string{"hutch", "completion", shell}); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "hutch."+shell)
	if err := os.WriteFile(f, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// run runs the shell's probe of every command and returns its lines;
// the probe runs in an empty directory, so that no file completes.
func run(t *testing.T, shell string, args ...string) []string {
	t.Helper()
	if _, err := exec.LookPath(shell); err != nil {
		t.Fatalf("%s is not installed (apt-get install %s): the completion cannot be checked", shell, shell)
	}
	cmd := exec.Command(shell, args...)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "HOME="+cmd.Dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", shell, err, out)
	}
	return strings.Split(string(out), "\n")
}

// check compares the probe's answers, lines "S|PATH|WORDS" for what
// completes after PATH and "F|PATH|WORDS" for what completes after PATH -.
func check(t *testing.T, shell string, lines []string, defs []want) {
	t.Helper()
	got := map[string][]string{}
	for _, l := range lines {
		if k, v, ok := strings.Cut(l, "#"); ok && (strings.HasPrefix(k, "S|") || strings.HasPrefix(k, "F|")) {
			ws := strings.Fields(v)
			sort.Strings(ws)
			got[k] = ws
		}
	}
	for _, d := range defs {
		p := strings.Join(d.path, " ")
		if g := got["S|"+p]; !slices.Equal(g, d.subs) {
			t.Errorf("%s: after %q the completion offers %q; the CLI has %q", shell, "hutch "+p, g, d.subs)
		}
		if g := got["F|"+p]; !slices.Equal(g, d.flags) {
			t.Errorf("%s: flags of %q: the completion offers %q; the CLI has %q", shell, "hutch "+p, g, d.flags)
		}
	}
}

// probes are the command lines each shell completes: every command, and
// with a flag value that names a command, which must not be taken for it.
func probes(defs []want) [][]string {
	var out [][]string
	for _, d := range defs {
		out = append(out, d.path)
	}
	return out
}

// TestBashCompletion loads the bash completion into bash and checks that
// for every command it offers exactly the CLI's subcommands and flags,
// and skips a flag's value.
func TestBashCompletion(t *testing.T) {
	defs := definitions(commands.App())
	var b strings.Builder
	fmt.Fprintf(&b, "source %q\n", script(t, "bash"))
	q := func(tag string, words []string, cur string) {
		all := append(append([]string{"hutch"}, words...), cur)
		quoted := make([]string, len(all))
		for i, w := range all {
			quoted[i] = fmt.Sprintf("%q", w)
		}
		fmt.Fprintf(&b, "COMP_WORDS=(%s); COMP_CWORD=%d; COMPREPLY=(); _hutch; echo \"%s|%s#${COMPREPLY[*]}\"\n",
			strings.Join(quoted, " "), len(all)-1, tag, strings.Join(words, " "))
	}
	for _, p := range probes(defs) {
		q("S", p, "")
		q("F", p, "-")
	}
	// --root takes a value: "ls" after it is not the ls command.
	q("S", []string{"--root", "ls"}, "")
	lines := run(t, "bash", "-c", b.String())
	check(t, "bash", lines, defs)
	if !slices.Contains(lines, "S|--root ls#"+strings.Join(defs[0].subs, " ")) {
		t.Errorf("bash: after hutch --root ls the completion does not offer the root's commands: %q", lines[len(lines)-2])
	}
}

// TestZshCompletion does the same with zsh, through stand-ins for the
// completion system's _describe and _files.
func TestZshCompletion(t *testing.T) {
	defs := definitions(commands.App())
	var b strings.Builder
	b.WriteString(`compdef() { :; }
_files() { :; }
_describe() { local -a items; items=("${(@P)4}"); print -rn -- ${items%%:*} }
`)
	fmt.Fprintf(&b, "source %q\n", script(t, "zsh"))
	q := func(tag string, words []string, cur string) {
		all := append(append([]string{"hutch"}, words...), cur)
		quoted := make([]string, len(all))
		for i, w := range all {
			quoted[i] = fmt.Sprintf("%q", w)
		}
		fmt.Fprintf(&b, "words=(%s); CURRENT=%d; print -rn -- %q; _hutch; print\n", strings.Join(quoted, " "), len(all), tag+"|"+strings.Join(words, " ")+"#")
	}
	for _, p := range probes(defs) {
		q("S", p, "")
		q("F", p, "-")
	}
	check(t, "zsh", run(t, "zsh", "-f", "-c", b.String()), defs)
}

// TestFishCompletion does the same with fish's own `complete -C`.
func TestFishCompletion(t *testing.T) {
	defs := definitions(commands.App())
	var b strings.Builder
	fmt.Fprintf(&b, "source %q\n", script(t, "fish"))
	q := func(tag string, words []string, cur string) {
		line := strings.Join(append(append([]string{"hutch"}, words...), cur), " ")
		fmt.Fprintf(&b, "echo %q(string join -- ' ' (complete -C %q | string replace -r -- '\\t.*' ''))\n", tag+"|"+strings.Join(words, " ")+"#", line)
	}
	for _, p := range probes(defs) {
		q("S", p, "")
		q("F", p, "-")
	}
	check(t, "fish", run(t, "fish", "--no-config", "-c", b.String()), defs)
}

// TestManPage checks that the manual page has a section for every
// command naming each of its flags, and that groff reads it without a
// warning.
func TestManPage(t *testing.T) {
	defs := definitions(commands.App())
	app := commands.App()
	var out bytes.Buffer
	app.Writer = &out
	if err := app.Run([]string{"hutch", "man", "--date", "2026-01-02"}); err != nil {
		t.Fatal(err)
	}
	page := out.String()
	esc := func(s string) string { return strings.ReplaceAll(s, "-", `\-`) }
	sections := map[string]string{}
	for _, part := range strings.Split(page, "\n.SS ")[1:] {
		title, body, _ := strings.Cut(part, "\n")
		sections[title] = body
	}
	_, global, _ := strings.Cut(page, ".SH GLOBAL OPTIONS\n")
	global, _, _ = strings.Cut(global, ".SH COMMANDS")
	for _, d := range defs {
		body := global
		if len(d.path) > 0 {
			var ok bool
			if body, ok = sections[esc("hutch "+strings.Join(d.path, " "))]; !ok {
				t.Errorf("the manual has no section for hutch %s", strings.Join(d.path, " "))
				continue
			}
		}
		for _, f := range d.flags {
			if !strings.Contains(body, `\fB`+esc(f)+`\fR`) {
				t.Errorf("the manual's hutch %s does not name %s", strings.Join(d.path, " "), f)
			}
		}
	}
	if _, err := exec.LookPath("groff"); err != nil {
		t.Fatal("groff is not installed (apt-get install groff-base): the page cannot be checked")
	}
	cmd := exec.Command("groff", "-man", "-ww", "-z", "-Tutf8")
	cmd.Stdin = strings.NewReader(page)
	if msg, err := cmd.CombinedOutput(); err != nil || len(msg) > 0 {
		t.Errorf("groff -ww: %v\n%s", err, msg)
	}
}
