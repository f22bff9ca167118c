package policy

import (
	"errors"
	"testing"

	"github.com/containerd/errdefs"
)

func TestParseVolume(t *testing.T) {
	for _, c := range []struct {
		in   string
		want VolumeSpec
	}{
		{"/home/me/p:/work", VolumeSpec{Source: "/home/me/p", Target: "/work"}},
		{"/home/me/p:/work:ro", VolumeSpec{Source: "/home/me/p", Target: "/work", ReadOnly: true}},
		{"/home/me/p:/work:rw", VolumeSpec{Source: "/home/me/p", Target: "/work"}},
		{"/home/me/p:/work:overlay", VolumeSpec{Source: "/home/me/p", Target: "/work", Overlay: true}},
		{"./p:/work", VolumeSpec{Source: "./p", Target: "/work"}},
		{"cache:/root/.cache", VolumeSpec{Volume: "cache", Target: "/root/.cache"}},
	} {
		got, err := ParseVolume(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseVolume(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{
		"", "/a", "/a:/b:ro:x", ":/b", "/a:b", "/a:/", "/a:/proc", "/a:/sys/x", "/a:/dev",
		"/a:/b/../c", "cache:/b:overlay", "/a:/b:rx", "bad name:/b", "-x:/b",
	} {
		if _, err := ParseVolume(in); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParseVolume(%q): want an invalid-argument error, got %v", in, err)
		}
	}
}

func TestCheckHostSource(t *testing.T) {
	root := "/var/lib/hutch"
	for _, p := range []string{"/", "/etc", "/usr", "/proc", "/proc/1", "/sys/fs", "/dev/shm", "/var/lib/hutch", "/var/lib", "/var/lib/hutch/volumes/x/data", "/boot"} {
		if err := CheckHostSource(p, root); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("CheckHostSource(%q) = %v; want refused", p, err)
		}
	}
	for _, p := range []string{"/home/me/project", "/srv/data", "/etc2", "/usr/local/src", "/var/lib/hutch2"} {
		if err := CheckHostSource(p, root); err != nil {
			t.Errorf("CheckHostSource(%q) = %v; want allowed", p, err)
		}
	}
	if err := CheckHostSource("/tmp", "/tmp/state"); err == nil {
		t.Error("a directory containing the state root was allowed")
	}
}
