package commands

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeBadConfig checks that serve refuses a config file with an
// unknown key or a bad value with exit status 125 and a message naming
// the file and the key, before it opens any state.
func TestServeBadConfig(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ text, want string }{
		{"lissen = \"127.0.0.1:1\"\n", `key "lissen": no such setting`},
		{"audit-log-keep = 0\n", `key "audit-log-keep" 0: want at least 1`},
		{"default-network = \"wide\"\n", `key "default-network": "wide": want none or open`},
		{"shutdown-timeout = \"soon\"\n", `key "shutdown-timeout": want a duration`},
		{"log-level = \"loud\"\n", `key "log-level": "loud": want debug, info, warn or error`},
	} {
		path := filepath.Join(dir, "serve.toml")
		if err := os.WriteFile(path, []byte(tc.text), 0o644); err != nil {
			t.Fatal(err)
		}
		root := filepath.Join(dir, "root")
		var stderr bytes.Buffer
		code := run(App(), []string{"hutch", "--root", root, "serve", "--config", path}, &stderr)
		if code != 125 || !strings.Contains(stderr.String(), path) || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%q: exit %d, %q; want 125 naming %s and %s", tc.text, code, stderr.String(), path, tc.want)
		}
		if _, err := os.Stat(root); err == nil {
			t.Errorf("%q: the state root was made", tc.text)
		}
	}
	var stderr bytes.Buffer
	missing := filepath.Join(dir, "none.toml")
	if code := run(App(), []string{"hutch", "serve", "--config", missing}, &stderr); code != 125 || !strings.Contains(stderr.String(), missing) {
		t.Errorf("a missing --config: exit %d, %q; want 125 naming it", code, stderr.String())
	}
}
