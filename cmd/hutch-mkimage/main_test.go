package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

func TestDeterministic(t *testing.T) {
	bb, err := findBusybox()
	if err != nil {
		if os.Getenv("HUTCH_INTEGRATION") != "" {
			t.Fatal("no busybox binary:", err)
		}
		t.Skip("no busybox binary:", err)
	}
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a", "busybox.tar"), filepath.Join(dir, "b.tar")
	for _, out := range []string{a, b} {
		if err := run(context.Background(), bb, image{}, "busybox:latest", out); err != nil {
			t.Fatal(err)
		}
	}
	ab, _ := os.ReadFile(a)
	bbytes, _ := os.ReadFile(b)
	if len(ab) == 0 || !bytes.Equal(ab, bbytes) {
		t.Fatalf("two runs differ (%d and %d bytes)", len(ab), len(bbytes))
	}
}

func findBusybox() (string, error) {
	var err error
	for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		if _, err = os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", err
}
