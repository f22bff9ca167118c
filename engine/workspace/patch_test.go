package workspace

import (
	"strings"
	"testing"
)

func TestLineDiffRebuildsBothSides(t *testing.T) {
	for _, c := range [][2]string{
		{"", "a\n"},
		{"a\nb\nc\n", "a\nc\n"},
		{"a\nb\nc\n", "x\nb\ny\nz\n"},
		{"1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n", "1\n2\nthree\n4\n5\n6\n7\n8\n9\nten\n"},
		{"same", "same\n"},
	} {
		a, b := splitLines([]byte(c[0])), splitLines([]byte(c[1]))
		var ra, rb strings.Builder
		for _, e := range lineDiff(a, b) {
			if e.op != '+' {
				ra.WriteString(e.line)
			}
			if e.op != '-' {
				rb.WriteString(e.line)
			}
		}
		if ra.String() != c[0] || rb.String() != c[1] {
			t.Errorf("lineDiff(%q, %q) rebuilds %q, %q", c[0], c[1], ra.String(), rb.String())
		}
	}
}

func TestWriteHunks(t *testing.T) {
	var w strings.Builder
	writeHunks(&w, splitLines([]byte("1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n")), splitLines([]byte("1\n2\nthree\n4\n5\n6\n7\n8\n9\n10\n11\n")))
	want := "@@ -1,6 +1,6 @@\n 1\n 2\n-3\n+three\n 4\n 5\n 6\n@@ -8,3 +8,4 @@\n 8\n 9\n 10\n+11\n"
	if w.String() != want {
		t.Errorf("hunks:\n%s\nwant:\n%s", w.String(), want)
	}
}
