package engine

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func TestResolveSecretRefs(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "key")
	if err := os.WriteFile(key, []byte("file-s3cr3t"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HUTCH_TEST_SECRET", "env-s3cr3t")
	got, err := ResolveSecretRefs([]string{"A=@" + key, "B=env:HUTCH_TEST_SECRET"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Name != "A" || string(got[0].Value) != "file-s3cr3t" || got[1].Name != "B" || string(got[1].Value) != "env-s3cr3t" {
		t.Fatalf("ResolveSecretRefs = %v", got)
	}
	if strings.Contains(got[0].String(), "s3cr3t") {
		t.Errorf("Secret.String shows the value: %s", got[0])
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
	t0 := time.Now()
	_, err = ResolveSecretRefs([]string{"A=@" + huge})
	if d := time.Since(t0); d > time.Second {
		t.Errorf("refusing a 2 GiB secret file took %v", d)
	}
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("a 2 GiB secret file: %v, want an invalid argument naming the limit", err)
	}
	if _, err := ResolveSecretRefs([]string{"A=env:HUTCH_TEST_UNSET_VAR"}); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "HUTCH_TEST_UNSET_VAR") {
		t.Errorf("an unset variable: %v", err)
	}
}

func TestLoadSecretsTakesValuesWithoutReading(t *testing.T) {
	// A value that looks like a reference is a value: nothing is read.
	got, err := loadSecrets(nil, []Secret{{Name: "A", Value: []byte("@/etc/shadow")}, {Name: "B", Value: []byte("env:HOME")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || string(got[0].Value) != "@/etc/shadow" || string(got[1].Value) != "env:HOME" || got[0].File != "" || got[1].Env != "" {
		t.Fatalf("loadSecrets = %+v", got)
	}
}
