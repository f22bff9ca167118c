package system

import (
	"bytes"
	"testing"

	"hutch.dev/hutch/serve"
)

// TestInfoWrite checks `hutch version`'s lines: "hutch VERSION" first,
// then the commit, the build date, Go and runsc.
func TestInfoWrite(t *testing.T) {
	i := Info{Version: serve.Version{Version: "1.2.3", Commit: "abc123", BuildDate: "2026-12-02T00:00:00Z", Go: "go1.26.8", Platform: "linux/amd64", Runsc: "runsc version release-20260905.0"}, RunscPath: "/usr/lib/hutch/runsc"}
	var b bytes.Buffer
	i.Write(&b)
	want := "hutch 1.2.3\n" +
		"  commit:  abc123\n" +
		"  built:   2026-12-02T00:00:00Z\n" +
		"  go:      go1.26.8 linux/amd64\n" +
		"  runsc:   runsc version release-20260905.0 (/usr/lib/hutch/runsc)\n"
	if b.String() != want {
		t.Fatalf("hutch version printed\n%s\nwant\n%s", b.String(), want)
	}
}
