package assembly

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// What a rootless network lacks is named with its fix: a program not
// installed, and a tun device the user may not open.
func TestRootlessNetworkMissing(t *testing.T) {
	dir := t.TempDir()
	tun := filepath.Join(dir, "tun")
	if err := os.WriteFile(tun, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	all := func(string) (string, error) { return "/usr/bin/x", nil }
	if got := rootlessNetworkMissing(all, tun); len(got) != 0 {
		t.Fatalf("with everything there: %v", got)
	}
	// A device that cannot be opened read-write: as root too, a
	// directory.
	if err := os.Remove(tun); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(tun, 0o700); err != nil {
		t.Fatal(err)
	}
	got := rootlessNetworkMissing(all, tun)
	if len(got) != 1 || !strings.Contains(got[0].What, tun+" is not usable by this user (mode 0700): is a directory") || !strings.Contains(got[0].Fix, "chmod 0666 "+tun) {
		t.Fatalf("an unopenable tun device: %+v", got)
	}
	noSlirp := func(p string) (string, error) {
		if p == "slirp4netns" {
			return "", errors.New("not found")
		}
		return "/usr/bin/" + p, nil
	}
	got = rootlessNetworkMissing(noSlirp, filepath.Join(dir, "none"))
	if len(got) != 2 || got[0].String() != "slirp4netns not found (as root: apt-get install slirp4netns)" ||
		!strings.Contains(got[1].What, "does not exist") || got[1].Fix != "as root: modprobe tun" {
		t.Fatalf("no slirp4netns, no tun device: %+v", got)
	}
}
