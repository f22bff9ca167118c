package registry

import "testing"

func TestDomainOf(t *testing.T) {
	for _, tc := range []struct{ ref, want string }{
		{"docker.io/library/python:3.12", "docker.io"},
		{"127.0.0.1:5000/test/busybox:1", "127.0.0.1:5000"},
		{"ghcr.io/o/r@sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "ghcr.io"},
		{"python", "docker.io"},
		{"NOT A REF", ""},
	} {
		if got := domainOf(tc.ref); got != tc.want {
			t.Errorf("domainOf(%q) = %q, want %q", tc.ref, got, tc.want)
		}
	}
}
