package serve

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
)

var update = flag.Bool("update", false, "rewrite deploy/host/serve.toml from the flags")

const defaultConfigFile = "../../../../deploy/host/serve.toml"

// TestDefaultConfigFile checks that the serve.toml the package installs is
// the one the flags make, so that it cannot drift from them (go test -run
// TestDefaultConfigFile -update rewrites it), and that it names every flag.
func TestDefaultConfigFile(t *testing.T) {
	got := DefaultConfig()
	if *update {
		if err := os.WriteFile(defaultConfigFile, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(defaultConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("deploy/host/serve.toml is not what the flags make: run go test ./cmd/hutch/commands/serve -run TestDefaultConfigFile -update")
	}
	// Commented out, it sets nothing.
	cf, err := parseConfig("serve.toml", want)
	if err != nil || len(cf.values) != 0 {
		t.Fatalf("the default file sets %v (error %v); want nothing", cf, err)
	}
	// Each key line uncommented, it is valid and sets each flag to its
	// default.
	keyLine := regexp.MustCompile(`(?m)^#([a-z][a-z0-9-]* = )`)
	cf, err = parseConfig("serve.toml", keyLine.ReplaceAll(want, []byte("$1")))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range serveFlags {
		if f != configFlag && !isHidden(f) {
			names = append(names, f.Names()[0])
		}
	}
	names = append(names, globalKeys...)
	for _, n := range names {
		var s setting
		for _, x := range settings() {
			if x.name() == n {
				s = x
			}
		}
		v, ok := cf.values[n]
		if !ok {
			t.Errorf("serve.toml has no key %s", n)
			continue
		}
		if !slices.Equal(v, keyDefault(s)) {
			t.Errorf("serve.toml key %s = %q, want its default %q", n, v, keyDefault(s))
		}
	}
	if len(cf.values) != len(names) {
		t.Errorf("serve.toml has %d keys, serve %d settings", len(cf.values), len(names))
	}
}

// TestConfigErrors checks that a bad file is refused with its path and
// the key at fault.
func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{`listen = "127.0.0.1:1"` + "\nlisten-addr = \"x\"", `key "listen-addr": no such setting`},
		{`audit-log-keep = "5"`, `key "audit-log-keep": want an integer, got the string "5"`},
		{`shutdown-timeout = "ten seconds"`, `key "shutdown-timeout": want a duration`},
		{`shutdown-timeout = 10`, `key "shutdown-timeout": want a duration as a string`},
		{`tls-self-signed = "yes"`, `key "tls-self-signed": want true or false`},
		{`host = "a.example"`, `key "host": want an array of strings`},
		{`host = ["a", 1]`, `key "host": element 1: want a string`},
		{`pod-cpus = "2"`, `key "pod-cpus": want a number`},
		{`[serve]` + "\nlisten = \"x\"", `key "serve": no such setting`},
		{`listen = `, `line 1`},
	} {
		_, err := parseConfig("/etc/hutch/serve.toml", []byte(tc.text))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "/etc/hutch/serve.toml") {
			t.Errorf("%q: error %v; want one naming the file and %s", tc.text, err, tc.want)
		}
	}
}

// TestConfigPrecedence checks that a flag wins over the environment,
// which wins over the file, which wins over the default, for serve's
// flags and the global ones the file holds.
func TestConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "serve.toml")
	if err := os.WriteFile(path, []byte(`
listen = "127.0.0.1:4000"
domain = "file.example"
default-network = "open"
host = ["a.example", "b.example"]
shutdown-timeout = "3s"
audit-log-keep = 7
log-level = "debug"
root = "/srv/hutch"
`), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvVar("domain"), "env.example")
	t.Setenv("HUTCH_SERVE_CONFIG", path)
	got := map[string]any{}
	var src *configSource
	app := &cli.App{Flags: clix.GlobalFlags, Commands: []*cli.Command{{
		Name: "serve", Flags: serveFlags, Action: func(c *cli.Context) error {
			var err error
			if src, err = applyConfig(c); err != nil {
				return err
			}
			for _, k := range []string{"listen", "domain", "default-network", "metrics-listen", "log-level", "root", "backend"} {
				got[k] = c.String(k)
			}
			got["host"] = c.StringSlice("host")
			got["shutdown-timeout"] = c.Duration("shutdown-timeout").String()
			got["audit-log-keep"] = c.Int("audit-log-keep")
			return nil
		},
	}}}
	if err := app.Run([]string{"hutch", "serve", "--default-network", "none"}); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"listen": "127.0.0.1:4000", "domain": "env.example", "default-network": "none",
		"metrics-listen": "", "log-level": "debug", "root": "/srv/hutch", "backend": "local",
		"host": []string{"a.example", "b.example"}, "shutdown-timeout": "3s", "audit-log-keep": 7,
	}
	for k, w := range want {
		if g := got[k]; !equalAny(g, w) {
			t.Errorf("%s = %v, want %v", k, g, w)
		}
	}
	if o := src.opt("listen"); o != path+` key "listen"` {
		t.Errorf("a key from the file is named %q", o)
	}
	if o := src.opt("domain"); o != "--domain" {
		t.Errorf("a key from the environment is named %q", o)
	}
}

func equalAny(a, b any) bool {
	if as, ok := a.([]string); ok {
		bs, ok := b.([]string)
		return ok && slices.Equal(as, bs)
	}
	return a == b
}
