package benchdoc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	start, end := Markers("lifecycle")
	section := func(body string) string { return start + "\n" + body + "\n" + end + "\n" }

	if err := WriteSection(path, "lifecycle", "one\n"); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if !strings.HasPrefix(string(b), "# Benchmarks\n") || !strings.Contains(string(b), "make bench") ||
		!strings.HasSuffix(string(b), section("one")) {
		t.Fatalf("new file:\n%s", b)
	}

	// Other sections, before and after, are kept as they are.
	other := "# Benchmarks\n\nintro\n\n" + section("old") + "\n<!-- bench:images:start -->\nimages\n<!-- bench:images:end -->\n"
	if err := os.WriteFile(path, []byte(other), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteSection(path, "lifecycle", "new"); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(path)
	want := "# Benchmarks\n\nintro\n\n" + section("new") + "\n<!-- bench:images:start -->\nimages\n<!-- bench:images:end -->\n"
	if string(b) != want {
		t.Fatalf("replaced:\n%s\nwant:\n%s", b, want)
	}

	// A file without the section gets it appended.
	if err := os.WriteFile(path, []byte("# Benchmarks\n\nintro\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteSection(path, "lifecycle", "x"); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(path)
	if string(b) != "# Benchmarks\n\nintro\n\n"+section("x") {
		t.Fatalf("appended:\n%s", b)
	}

	// Half a section is an error, not a guess.
	if err := os.WriteFile(path, []byte(start+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteSection(path, "lifecycle", "y"); err == nil {
		t.Fatal("unbalanced markers accepted")
	}
}
