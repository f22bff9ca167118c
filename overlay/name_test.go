package overlay

import (
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
)

func TestRegistryName(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"python:3.12", "docker.io/library/python:3.12"},
		{"busybox", "docker.io/library/busybox:latest"},
		{"o/r", "docker.io/o/r:latest"},
		{"ghcr.io/o/r:tag", "ghcr.io/o/r:tag"},
		{"127.0.0.1:5000/test/busybox:1", "127.0.0.1:5000/test/busybox:1"},
		{"busybox:1@sha256:" + strings.Repeat("b", 64), "docker.io/library/busybox@sha256:" + strings.Repeat("b", 64)},
	} {
		got, err := RegistryName(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("RegistryName(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "UPPER", "a b", "x@sha256:zz", ":tag"} {
		if got, err := RegistryName(in); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("RegistryName(%q) = %q, %v; want ErrInvalidArgument", in, got, err)
		}
	}
}

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
		// Registry references keep their full, docker-normalized name.
		{in: "docker.io/library/base", want: "docker.io/library/base:latest"},
		{in: "docker.io/python:3.12", want: "docker.io/library/python:3.12"},
		{in: "index.docker.io/o/r:1", want: "docker.io/o/r:1"},
		{in: "localhost:5000/base:1", want: "localhost:5000/base:1"},
		{in: "localhost/base", want: "localhost/base:latest"},
		{in: "127.0.0.1:5000/test/busybox:1", want: "127.0.0.1:5000/test/busybox:1"},
		{in: "ghcr.io/o/r", want: "ghcr.io/o/r:latest"},
		{in: "[::1]:5000/o/r:t", want: "[::1]:5000/o/r:t"},
		{in: "base@sha256:" + strings.Repeat("0", 64), want: "docker.io/library/base@sha256:" + strings.Repeat("0", 64)},
		{in: "ghcr.io/o/r:1@sha256:" + strings.Repeat("a", 64), want: "ghcr.io/o/r@sha256:" + strings.Repeat("a", 64)},
		{in: "base@sha256:00", errHas: "invalid image reference"},
		{in: "ghcr.io/O/r", errHas: "invalid image reference"},
		{in: "ghcr.io/o/r:", errHas: "invalid image reference"},
		{in: "ghcr.io/o//r", errHas: "invalid image reference"},
		{in: "127.0.0.1:5000/../etc", errHas: "invalid image reference"},
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
		if strings.ContainsAny(n, " \x00\\") || strings.Contains(n, "..") || strings.HasPrefix(n, "/") {
			t.Fatalf("ParseName(%q) = %q: unsafe characters", s, n)
		}
		if i := strings.IndexByte(n, '@'); i >= 0 {
			if d := n[i+1:]; digest.Digest(d).Validate() != nil {
				t.Fatalf("ParseName(%q) = %q: bad digest %q", s, n, d)
			}
			return
		}
		if i := strings.LastIndexByte(n, ':'); i < 0 || i <= strings.LastIndexByte(n, '/') {
			t.Fatalf("ParseName(%q) = %q: no tag", s, n)
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
