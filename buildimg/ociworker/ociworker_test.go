package ociworker

import (
	"reflect"
	"strings"
	"testing"
)

func TestTranslate(t *testing.T) {
	c := Config{Runsc: "/bin/runsc", Root: "/r"}
	pre := []string{"--root", "/r", "--overlay2=none", "--network=none", "--gofer-network-namespace=new"}
	for _, tc := range []struct {
		name    string
		in      []string
		want    []string
		sub, id string
	}{
		{"run drops --keep and --no-pivot",
			[]string{"--log", "/l.json", "--log-format", "json", "run", "--bundle", "/b", "--no-pivot", "--keep", "id1"},
			append(pre, "--log", "/l.json", "--log-format", "json", "run", "--bundle", "/b", "id1"), "run", ""},
		{"runc's own root is replaced",
			[]string{"--root", "/run/runc", "--rootless=false", "state", "id1"},
			append(pre, "state", "id1"), "state", ""},
		{"delete names its container",
			[]string{"--log", "/l", "delete", "--force", "id2"},
			append(pre, "--log", "/l", "delete", "--force", "id2"), "delete", "id2"},
		{"exec keeps its flags",
			[]string{"exec", "--process", "/p.json", "--pid-file", "/pid", "--detach", "id3"},
			append(pre, "exec", "--process", "/p.json", "--pid-file", "/pid", "--detach", "id3"), "exec", ""},
		{"version passes through", []string{"--version"}, []string{"--version"}, "", ""},
		{"preserve-fds is dropped with its value",
			[]string{"run", "--preserve-fds", "2", "--bundle", "/b", "id4"},
			append(pre, "run", "--bundle", "/b", "id4"), "run", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, sub, id := c.Translate(tc.in)
			if !reflect.DeepEqual(got, tc.want) || sub != tc.sub || id != tc.id {
				t.Fatalf("Translate(%q)\n got %q %q %q\nwant %q %q %q", tc.in, got, sub, id, tc.want, tc.sub, tc.id)
			}
		})
	}
}

// A rootless buildkitd's steps run without the host's cgroups.
func TestTranslateRootless(t *testing.T) {
	c := Config{Runsc: "/bin/runsc", Root: "/r", Rootless: true}
	got, _, _ := c.Translate([]string{"--rootless=true", "run", "--bundle", "/b", "id1"})
	want := []string{"--root", "/r", "--overlay2=none", "--network=none", "--gofer-network-namespace=new", "--ignore-cgroups", "run", "--bundle", "/b", "id1"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	for _, kv := range c.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	if env, err := ConfigFromEnv(); err != nil || !env.Rootless {
		t.Fatalf("Env %q does not carry Rootless", c.Env())
	}
}
