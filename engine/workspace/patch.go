package workspace

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"strings"

	"golang.org/x/sys/unix"
)

// maxPatchFile is the largest file WritePatch shows line by line.
const maxPatchFile = 8 << 20

// WritePatch writes d's file changes as a unified diff (a/ is the host
// directory, b/ the sandbox, both named by their path in the sandbox).
// A binary file, or one past 8 MiB, gets a line saying it differs; a
// mode or symlink change gets git's extended header lines. It reads the
// layers again: a file changed since Diff shows as it is now.
func (d Diff) WritePatch(w io.Writer) error {
	if d.ws == nil || len(d.Changes) == 0 {
		return nil
	}
	upper, err := openLayer(d.ws.upper())
	if err != nil {
		return err
	}
	defer upper.close()
	lower, err := openLayer(d.Source)
	if err != nil {
		return err
	}
	defer lower.close()
	for _, c := range d.Changes {
		if c.Type == "dir" || c.Type == "other" {
			continue
		}
		name := strings.TrimPrefix(c.Path, "/")
		var old, cur []byte
		var oldOK, curOK bool
		if c.Kind != ChangeAdded {
			old, oldOK = readSmall(lower, c.rel)
		}
		if c.Kind != ChangeDeleted {
			cur, curOK = readSmall(upper, c.rel)
		}
		fmt.Fprintf(w, "diff --git a/%s b/%s\n", name, name)
		switch {
		case c.Kind == ChangeAdded:
			fmt.Fprintf(w, "new file mode %s\n", gitMode(c.Type, c.Mode))
		case c.Kind == ChangeDeleted:
			fmt.Fprintf(w, "deleted file mode %s\n", gitMode(c.Type, c.OldMode))
		case c.Mode != c.OldMode:
			fmt.Fprintf(w, "old mode %s\nnew mode %s\n", gitMode(c.Type, c.OldMode), gitMode(c.Type, c.Mode))
		}
		if (c.Kind != ChangeAdded && !oldOK) || (c.Kind != ChangeDeleted && !curOK) {
			fmt.Fprintf(w, "Binary files a/%s and b/%s differ\n", name, name)
			continue
		}
		if bytes.Equal(old, cur) && c.Kind == ChangeModified {
			continue // a mode change only
		}
		from, to := "a/"+name, "b/"+name
		if c.Kind == ChangeAdded {
			from = "/dev/null"
		}
		if c.Kind == ChangeDeleted {
			to = "/dev/null"
		}
		fmt.Fprintf(w, "--- %s\n+++ %s\n", from, to)
		writeHunks(w, splitLines(old), splitLines(cur))
	}
	return nil
}

// readSmall reads rel for a patch: a symlink as its target, a file if it
// is text (no NUL byte) and not too large; ok is false otherwise.
func readSmall(l *layer, rel string) ([]byte, bool) {
	st, err := l.lstat(rel)
	if err != nil {
		return nil, false
	}
	if fileType(st) == "symlink" {
		t, err := l.readlink(rel)
		return []byte(t + "\n"), err == nil
	}
	if fileType(st) != "file" || st.Size > maxPatchFile {
		return nil, false
	}
	f, err := l.open(rel, unix.O_RDONLY)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxPatchFile+1))
	if err != nil || len(b) > maxPatchFile || bytes.IndexByte(b, 0) >= 0 {
		return nil, false
	}
	return b, true
}

// gitMode renders a mode as git's headers do.
func gitMode(typ string, m fs.FileMode) string {
	if typ == "symlink" {
		return "120000"
	}
	return fmt.Sprintf("100%03o", m.Perm())
}

// splitLines splits b into lines, each with its newline (the last may
// lack one).
func splitLines(b []byte) []string {
	var out []string
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			out = append(out, string(b))
			break
		}
		out = append(out, string(b[:i+1]))
		b = b[i+1:]
	}
	return out
}

// maxEdits bounds the Myers search; past it, the files are shown as one
// hunk that replaces all of a with all of b.
const maxEdits = 4000

// edit is one line of a diff: ' ', '-' or '+'.
type edit struct {
	op   byte
	line string
}

// lineDiff is Myers' O(ND) diff of a and b.
func lineDiff(a, b []string) []edit {
	n, m := len(a), len(b)
	max := n + m
	if max > 2*maxEdits {
		max = 2 * maxEdits
	}
	off := max + 1
	v := make([]int, 2*max+3)
	var trace [][]int
	found := false
	for d := 0; d <= max && !found; d++ {
		trace = append(trace, append([]int(nil), v...))
		for k := -d; k <= d; k += 2 {
			var x int
			if k == -d || (k != d && v[off+k-1] < v[off+k+1]) {
				x = v[off+k+1]
			} else {
				x = v[off+k-1] + 1
			}
			y := x - k
			for x < n && y < m && a[x] == b[y] {
				x, y = x+1, y+1
			}
			v[off+k] = x
			if x >= n && y >= m {
				found = true
				break
			}
		}
	}
	if !found {
		var out []edit
		for _, l := range a {
			out = append(out, edit{'-', l})
		}
		for _, l := range b {
			out = append(out, edit{'+', l})
		}
		return out
	}
	// Walk back through the saved frontiers.
	var rev []edit
	x, y := n, m
	for d := len(trace) - 1; d > 0; d-- {
		vd := trace[d]
		k := x - y
		var pk int
		if k == -d || (k != d && vd[off+k-1] < vd[off+k+1]) {
			pk = k + 1
		} else {
			pk = k - 1
		}
		px := vd[off+pk]
		py := px - pk
		for x > px && y > py {
			x, y = x-1, y-1
			rev = append(rev, edit{' ', a[x]})
		}
		if x == px {
			y--
			rev = append(rev, edit{'+', b[y]})
		} else {
			x--
			rev = append(rev, edit{'-', a[x]})
		}
	}
	for x > 0 && y > 0 {
		x, y = x-1, y-1
		rev = append(rev, edit{' ', a[x]})
	}
	out := make([]edit, len(rev))
	for i, e := range rev {
		out[len(rev)-1-i] = e
	}
	return out
}

// writeHunks writes the unified hunks (three lines of context) turning
// a into b.
func writeHunks(w io.Writer, a, b []string) {
	es := lineDiff(a, b)
	const ctx = 3
	for i := 0; i < len(es); {
		for i < len(es) && es[i].op == ' ' {
			i++
		}
		if i == len(es) {
			return
		}
		start := i - ctx
		if start < 0 {
			start = 0
		}
		end := i
		for j := i; j < len(es); j++ {
			if es[j].op != ' ' {
				end = j + 1
			} else if j-end >= 2*ctx {
				break
			}
		}
		stop := end + ctx
		if stop > len(es) {
			stop = len(es)
		}
		// Line numbers at start.
		la, lb := 0, 0
		for _, e := range es[:start] {
			if e.op != '+' {
				la++
			}
			if e.op != '-' {
				lb++
			}
		}
		ca, cb := 0, 0
		for _, e := range es[start:stop] {
			if e.op != '+' {
				ca++
			}
			if e.op != '-' {
				cb++
			}
		}
		fmt.Fprintf(w, "@@ -%s +%s @@\n", hunkRange(la, ca), hunkRange(lb, cb))
		for _, e := range es[start:stop] {
			io.WriteString(w, string(e.op)+e.line) //nolint:errcheck // w's errors show at its end
			if !strings.HasSuffix(e.line, "\n") {
				io.WriteString(w, "\n\\ No newline at end of file\n") //nolint:errcheck
			}
		}
		i = stop
	}
}

func hunkRange(start, n int) string {
	if n == 0 {
		return fmt.Sprintf("%d,0", start)
	}
	if n == 1 {
		return fmt.Sprintf("%d", start+1)
	}
	return fmt.Sprintf("%d,%d", start+1, n)
}
