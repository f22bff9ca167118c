package serve

import (
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestCheckVolumeName(t *testing.T) {
	long := strings.Repeat("t", 60) // leaves two characters after "TENANT."
	for _, c := range []struct {
		tenant, name string
		ok           bool
	}{
		{"acme", "data", true},
		{"acme", "my.data_v-2", true},
		{"acme", "/etc", false},
		{"acme", "../x", false},
		{"acme", ".hidden", false},
		{"acme", "a/b", false},
		{"acme", "", false},
		{"acme", strings.Repeat("v", 58), true},
		{"acme", strings.Repeat("v", 59), false},
		{long, "ab", true},
		{long, "abc", false},
	} {
		err := checkVolumeName(c.tenant, c.name)
		if (err == nil) != c.ok {
			t.Errorf("checkVolumeName(%q, %q) = %v, want ok %v", c.tenant, c.name, err, c.ok)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("checkVolumeName(%q, %q): %v is not ErrInvalidArgument", c.tenant, c.name, err)
		}
	}
}

// No two tenants' volume names are the same engine name: tenant names
// have no '.', so the prefix ends at the first one.
func TestTenantVolumeUnambiguous(t *testing.T) {
	if a, b := tenantVolume("a", "b.c"), tenantVolume("a-b", "c"); a == b {
		t.Fatalf("tenants a and a-b share the engine name %q", a)
	}
	got := tenantVolume("a_b", "x.y")
	if tenant, name, _ := strings.Cut(got, volumeSep); tenant != "a_b" || name != "x.y" {
		t.Fatalf("%q splits into %q and %q", got, tenant, name)
	}
}
