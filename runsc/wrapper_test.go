package runsc

import (
	"context"
	"slices"
	"testing"
)

// With a Wrapper, every runsc command runs through it: the wrapper's
// program, its arguments, then runsc and runsc's own arguments.
func TestWrapperPrefixesCommand(t *testing.T) {
	r := &Runsc{Path: "/opt/runsc", Root: "/state", Wrapper: []string{"/usr/bin/nsenter", "--target=42", "--user", "--"}}
	cmd := r.command(context.Background(), "state", "abc")
	want := append([]string{"/usr/bin/nsenter", "--target=42", "--user", "--", "/opt/runsc"}, r.globalArgs()...)
	want = append(want, "state", "abc")
	if cmd.Path != "/usr/bin/nsenter" || !slices.Equal(cmd.Args, want) {
		t.Fatalf("command with a wrapper: %s %q, want %q", cmd.Path, cmd.Args, want)
	}
	r.Wrapper = nil
	cmd = r.command(context.Background(), "state", "abc")
	if cmd.Path != "/opt/runsc" || cmd.Args[0] != "/opt/runsc" || cmd.Args[len(cmd.Args)-1] != "abc" {
		t.Fatalf("command without a wrapper: %s %q", cmd.Path, cmd.Args)
	}
}
