package policy

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestParseSecret(t *testing.T) {
	for _, tc := range []struct {
		in         string
		name       string
		file, env  string
		err        bool
		notInError string
	}{
		{in: "API_KEY=@/run/key", name: "API_KEY", file: "/run/key"},
		{in: "_X1=env:HOME", name: "_X1", env: "HOME"},
		{in: "TOKEN=@relative/path", name: "TOKEN", file: "relative/path"},
		{in: "TOKEN=hunter2-literal", err: true, notInError: "hunter2-literal"},
		{in: "TOKEN=@", err: true},
		{in: "TOKEN=env:", err: true},
		{in: "TOKEN=env:A=B", err: true},
		{in: "token=@f", err: true},
		{in: "1TOKEN=@f", err: true},
		{in: "TO-KEN=@f", err: true},
		{in: "=@f", err: true},
		{in: "TOKEN", err: true},
		{in: "", err: true},
		{in: "TOKEN=@a\x00b", err: true},
	} {
		s, err := ParseSecret(tc.in)
		if (err != nil) != tc.err {
			t.Errorf("ParseSecret(%q) error = %v, want error %v", tc.in, err, tc.err)
			continue
		}
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("ParseSecret(%q): %v is not invalid argument", tc.in, err)
			}
			if tc.notInError != "" && strings.Contains(err.Error(), tc.notInError) {
				t.Errorf("ParseSecret(%q): error %q repeats the value", tc.in, err)
			}
			continue
		}
		if s.Name != tc.name || s.File != tc.file || s.Env != tc.env {
			t.Errorf("ParseSecret(%q) = %+v", tc.in, s)
		}
		if got := s.String(); got != tc.in {
			t.Errorf("String() = %q, want %q", got, tc.in)
		}
	}
}

// staticWords is the fixed wording of ParseSecret's errors: a fuzzed value
// that happens to be part of it is not a leak.
const staticWords = "invalid argument: --secret: want NAME=@FILE or NAME=env:VAR the name must match [A-Z_][A-Z0-9_]* (at most 128 characters) bad file name bad variable name (values are never given on the command line)..."

func FuzzParseSecret(f *testing.F) {
	for _, s := range []string{"A=@f", "A=env:B", "A=literal", "a=@f", "=", "A=@", "A=env:", "A=env:B=C"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		s, err := ParseSecret(spec)
		name, rest, _ := strings.Cut(spec, "=")
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("ParseSecret(%q): %v is not invalid argument", spec, err)
			}
			msg := strings.ReplaceAll(err.Error(), strconv.Quote(truncate(name, 128)), "")
			msg = strings.ReplaceAll(msg, name, "")
			if len(rest) >= 4 && strings.Contains(msg, rest) && !strings.Contains(staticWords, rest) {
				t.Fatalf("ParseSecret(%q): error %q repeats what follows '='", spec, err)
			}
			return
		}
		if !secretNameRE.MatchString(s.Name) || (s.File == "") == (s.Env == "") {
			t.Fatalf("ParseSecret(%q) = %+v", spec, s)
		}
		if s.String() != spec {
			t.Fatalf("ParseSecret(%q) does not round-trip: %q", spec, s.String())
		}
	})
}

func TestSecretChecks(t *testing.T) {
	dir := t.TempDir()
	key := dir + "/key"
	if err := os.WriteFile(key, []byte("s3cr3t-value"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HUTCH_TEST_SECRET", "env-s3cr3t")
	load := func(specs ...string) []Secret {
		t.Helper()
		s, err := LoadSecrets(specs, os.ReadFile, os.LookupEnv)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ok := load("A=@"+key, "B=env:HUTCH_TEST_SECRET")
	if string(ok[0].Value) != "s3cr3t-value" || string(ok[1].Value) != "env-s3cr3t" {
		t.Fatalf("loaded %q %q", ok[0].Value, ok[1].Value)
	}
	if _, err := Validate(Request{Secrets: ok}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		req  Request
		want string
	}{
		{"missing file", Request{Secrets: load("A=@" + dir + "/nope")}, "no such file"},
		{"unreadable dir", Request{Secrets: load("A=@" + dir)}, "is a directory"},
		{"unset env", Request{Secrets: load("A=env:HUTCH_TEST_UNSET_VAR")}, "HUTCH_TEST_UNSET_VAR is not set"},
		{"twice", Request{Secrets: load("A=@"+key, "A=env:HUTCH_TEST_SECRET")}, "given twice"},
		{"env clash", Request{Secrets: load("A=@" + key), Env: []string{"A=1"}}, "both --env and --secret"},
		{"too large", Request{Secrets: []Secret{{Name: "A", Env: "X", Value: make([]byte, MaxSecretSize+1)}}}, "larger than"},
		{"nul", Request{Secrets: []Secret{{Name: "A", Env: "X", Value: []byte("a\x00b")}}}, "NUL"},
	} {
		_, err := Validate(tc.req)
		if err == nil || !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want invalid argument naming %q", tc.name, err, tc.want)
			continue
		}
		for _, s := range tc.req.Secrets {
			if len(s.Value) > 0 && strings.Contains(err.Error(), string(s.Value)) {
				t.Errorf("%s: error %q holds the secret's value", tc.name, err)
			}
		}
	}
}
