// Package benchdoc writes one benchmark program's section of
// docs/benchmarks.md, leaving the other programs' sections as they are.
package benchdoc

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Markers are the comments that delimit the section of program name.
func Markers(name string) (start, end string) {
	return "<!-- bench:" + name + ":start -->", "<!-- bench:" + name + ":end -->"
}

// header starts a file that does not exist yet.
const header = "# Benchmarks\n\nEvery number on this page is written by a benchmark program in a real run; " +
	"regenerate them with `make bench` (as root).\n"

// WriteSection replaces the section of program name in the markdown file at
// path with body, appending the section if the file has none and creating
// the file if needed. The file is replaced atomically; half a section (one
// marker without the other) is an error, not a guess.
func WriteSection(path, name, body string) error {
	start, end := Markers(name)
	section := start + "\n" + strings.TrimRight(body, "\n") + "\n" + end + "\n"
	old, err := os.ReadFile(path)
	var doc string
	switch {
	case os.IsNotExist(err):
		doc = header + "\n" + section
	case err != nil:
		return err
	default:
		doc = string(old)
		i, j := strings.Index(doc, start), strings.Index(doc, end)
		switch {
		case i >= 0 && j > i:
			doc = doc[:i] + section + strings.TrimPrefix(doc[j+len(end):], "\n")
		case i < 0 && j < 0:
			doc = strings.TrimRight(doc, "\n") + "\n\n" + section
		default:
			return fmt.Errorf("%s: unbalanced %s / %s markers", path, start, end)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(doc), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
