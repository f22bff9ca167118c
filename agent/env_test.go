package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteEnv(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "hutch", "env")
	if rc := writeEnv(strings.NewReader(`{"A":"1","B":"two words"}`), path); rc != 0 {
		t.Fatalf("writeEnv: status %d", rc)
	}
	if rc := writeEnv(strings.NewReader(`{"A":"3"}`), path); rc != 0 {
		t.Fatalf("second writeEnv: status %d", rc)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	if err := json.Unmarshal(b, &got); err != nil || len(got) != 1 || got["A"] != "3" {
		t.Fatalf("env file %q: want the last write whole, {A: 3}", b)
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644", fi.Mode().Perm())
	}
	if rc := writeEnv(strings.NewReader(`["A=1"]`), path); rc != 2 {
		t.Errorf("a JSON array: status %d, want 2", rc)
	}
	if _, err := os.Stat(path + ".tmp"); err == nil {
		t.Errorf("a temporary file was left behind")
	}
}
