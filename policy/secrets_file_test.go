package policy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func TestReadSecretFile(t *testing.T) {
	dir := t.TempDir()
	small := filepath.Join(dir, "small")
	if err := os.WriteFile(small, []byte("s3cr3t"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadSecretFile(small); err != nil || string(b) != "s3cr3t" {
		t.Fatalf("ReadSecretFile(small) = %q, %v", b, err)
	}
	exact := filepath.Join(dir, "exact")
	if err := os.WriteFile(exact, make([]byte, MaxSecretSize), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadSecretFile(exact); err != nil || len(b) != MaxSecretSize {
		t.Fatalf("ReadSecretFile of a file of exactly MaxSecretSize = %d bytes, %v", len(b), err)
	}

	huge := filepath.Join(dir, "huge")
	f, err := os.Create(huge)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(2 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{huge, "larger than"},
		{fifo, "not a regular file"},
		{"/dev/zero", "not a regular file"},
		{dir, "not a regular file"},
	} {
		t0 := time.Now()
		b, err := ReadSecretFile(tc.path)
		if d := time.Since(t0); d > time.Second {
			t.Errorf("ReadSecretFile(%s) took %v", tc.path, d)
		}
		if err == nil || !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ReadSecretFile(%s) = %d bytes, %v; want an invalid argument naming %q", tc.path, len(b), err, tc.want)
		}
	}
	if _, err := ReadSecretFile(filepath.Join(dir, "nope")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ReadSecretFile of a missing file: %v, want not exist", err)
	}

	loaded, err := LoadSecrets([]string{"A=@" + huge}, ReadSecretFile, os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Validate(Request{Secrets: loaded}); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("a 2 GiB secret file validates: %v", err)
	}
}

func TestSecretByValueSource(t *testing.T) {
	s := Secret{Name: "TOKEN", Value: []byte("s3cr3t")}
	if s.Source() != "value" || strings.Contains(s.String(), "s3cr3t") {
		t.Errorf("a secret given by value shows as %q (source %q)", s.String(), s.Source())
	}
	if _, err := Validate(Request{Secrets: []Secret{s}}); err != nil {
		t.Errorf("a secret given by value does not validate: %v", err)
	}
}
