package overlay

import (
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestParseName(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		errHas   string
	}{
		{in: "base", want: "base:latest"},
		{in: "base:latest", want: "base:latest"},
		{in: "my-org/py_env.v2:3.12-slim", want: "my-org/py_env.v2:3.12-slim"},
		{in: "a/b/c:T_1", want: "a/b/c:T_1"},
		{in: "a__b--c", want: "a__b--c:latest"},
		{in: "foo.bar", want: "foo.bar:latest"},
		{in: "x:" + strings.Repeat("t", 128), want: "x:" + strings.Repeat("t", 128)},
		{in: strings.Repeat("a", 255), want: strings.Repeat("a", 255) + ":latest"},

		{in: "", errHas: "empty"},
		{in: ":tag", errHas: "empty repository"},
		{in: "base:", errHas: "tag must match"},
		{in: "base:.x", errHas: "tag must match"},
		{in: "x:" + strings.Repeat("t", 129), errHas: "tag must match"},
		{in: strings.Repeat("a", 256), errHas: "longer than 255"},
		{in: "Base", errHas: "lowercase"},
		{in: "base@sha256:" + strings.Repeat("0", 64), errHas: "digest"},
		{in: "docker.io/library/base", errHas: "registries are not supported"},
		{in: "localhost:5000/base:1", errHas: "registries are not supported"},
		{in: "localhost/base", errHas: "registries are not supported"},
		{in: "a//b", errHas: "component"},
		{in: "/base", errHas: "component"},
		{in: "base/", errHas: "component"},
		{in: "-base", errHas: "component"},
		{in: "ba..se", errHas: "component"},
		{in: "ba se", errHas: "component"},
		{in: "../etc", errHas: "component"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseName(tc.in)
			if tc.errHas != "" {
				if err == nil {
					t.Fatalf("ParseName(%q) = %q, want error", tc.in, got)
				}
				if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("ParseName(%q) error %q: want ErrInvalidArgument mentioning %q", tc.in, err, tc.errHas)
				}
				if !strings.Contains(err.Error(), "\""+tc.in+"\"") && len(tc.in) < 100 {
					t.Fatalf("error %q does not name the input", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseName(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
}

func FuzzParseName(f *testing.F) {
	for _, s := range []string{"base", "a/b:c", "docker.io/x", "x@sha256:00", "A", "a:b:c", "a/../b", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseName(s)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("ParseName(%q): error %v does not wrap ErrInvalidArgument", s, err)
			}
			return
		}
		again, err := ParseName(n)
		if err != nil || again != n {
			t.Fatalf("ParseName(%q) = %q, but ParseName of that = %q, %v", s, n, again, err)
		}
		if strings.ContainsAny(n, "@ \x00\\") || strings.Contains(n, "..") || strings.HasPrefix(n, "/") {
			t.Fatalf("ParseName(%q) = %q: unsafe characters", s, n)
		}
		if i := strings.LastIndexByte(n, ':'); i < 0 || i > 255 {
			t.Fatalf("ParseName(%q) = %q: bad tag position", s, n)
		}
	})
}

func TestValidLeaseID(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"sb-1", true}, {"a", true}, {"A.b_c-9", true}, {strings.Repeat("a", 128), true},
		{"", false}, {".hidden", false}, {"-x", false}, {"a/b", false}, {"..", false},
		{strings.Repeat("a", 129), false}, {"a b", false},
	} {
		if err := validLeaseID(tc.id); (err == nil) != tc.ok {
			t.Errorf("validLeaseID(%q) = %v, want ok=%v", tc.id, err, tc.ok)
		}
	}
}
