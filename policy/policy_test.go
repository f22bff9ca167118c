package policy

import (
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  bool
	}{
		{"1048576", 1 << 20, false},
		{"512m", 512 << 20, false},
		{"512M", 512 << 20, false},
		{"2GiB", 2 << 30, false},
		{"2gb", 2 << 30, false},
		{"1.5g", 3 << 29, false},
		{"64k", 64 << 10, false},
		{"1t", 1 << 40, false},
		{" 10m ", 10 << 20, false},
		{"", 0, true},
		{"m", 0, true},
		{"abc", 0, true},
		{"-1m", 0, true},
		{"1x", 0, true},
		{"1e3", 0, true},
		{"0x10", 0, true},
		{"NaN", 0, true},
		{"inf", 0, true},
		{"99999999999t", 0, true},
	} {
		got, err := ParseSize(tc.in)
		if (err != nil) != tc.err {
			t.Errorf("ParseSize(%q) error = %v, want error %v", tc.in, err, tc.err)
			continue
		}
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.in) {
				t.Errorf("ParseSize(%q) error %q: want invalid argument naming the input", tc.in, err)
			}
			continue
		}
		if got != tc.want {
			t.Errorf("ParseSize(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"1", "512m", "2GiB", "1.5g", "", "-1", "1e9", "NaN"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			return
		}
		if n < 0 {
			t.Fatalf("ParseSize(%q) = %d: negative", s, n)
		}
		// A formatted size parses back to within rounding.
		back, err := ParseSize(strings.TrimSuffix(FormatSize(n), "B"))
		if err != nil {
			t.Fatalf("FormatSize(%d) = %q does not parse: %v", n, FormatSize(n), err)
		}
		if diff := back - n; diff > n/10+1 || diff < -(n/10+1) {
			t.Fatalf("round trip of %d gave %d", n, back)
		}
	})
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  Request
		want string // substring of the error; empty: valid
	}{
		{"defaults", Request{}, ""},
		{"cpus negative", Request{CPUs: -1}, "--cpus"},
		{"memory tiny", Request{Memory: 1 << 20}, "--memory"},
		{"pids tiny", Request{Pids: 1}, "--pids"},
		{"disk tiny", Request{Disk: 10}, "--disk"},
		{"net unknown", Request{Network: "bogus"}, "--net"},
		{"env no equals", Request{Env: []string{"FOO"}}, "FOO"},
		{"workdir relative", Request{Workdir: "tmp"}, "--workdir"},
		{"rootless limit", Request{Rootless: true, Explicit: []string{"memory"}}, "--memory"},
		{"rootless defaults", Request{Rootless: true}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Validate(tc.req)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				if got.CPUs != DefaultCPUs || got.Memory != DefaultMemory || got.Network != NetNone {
					t.Fatalf("defaults not applied: %+v", got)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Validate error = %v, want invalid argument mentioning %q", err, tc.want)
			}
		})
	}
}
