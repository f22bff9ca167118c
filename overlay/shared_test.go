package overlay

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
)

// An image shared by its owner is readable by others in the OCI layout
// only, and a reader's copy runs like one it imported itself.
func TestSharedStoreCopy(t *testing.T) {
	ctx := context.Background()
	own := newStore(t)
	ar, ti := simpleArchive(t, layer{tar: baseLayer(t), compression: "gzip"})
	importBytes(t, own, "base", ar)

	dir := filepath.Join(t.TempDir(), "shared")
	shared, err := OpenShared(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := shared.CopyImage(ctx, own, "base", SourceImport); err != nil {
		t.Fatal(err)
	}
	modes := map[string]os.FileMode{
		".": 0o755, "oci": 0o755, "oci/blobs": 0o755, "oci/blobs/sha256": 0o755,
		"oci/index.json": 0o644, "oci/oci-layout": 0o644,
		"oci/blobs/sha256/" + ti.manifest.Digest.Encoded(): 0o444,
		"rootfs": 0o700, "leases": 0o700, "locks": 0o700,
	}
	for p, want := range modes {
		fi, err := os.Stat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %04o, want %04o", p, fi.Mode().Perm(), want)
		}
	}

	ro, err := OpenReadOnly(dir)
	if err != nil {
		t.Fatal(err)
	}
	user := newStore(t)
	img, err := user.CopyImage(ctx, ro, "base:latest", "shared")
	if err != nil {
		t.Fatal(err)
	}
	if img.Digest != ti.manifest.Digest || img.Source != "shared" {
		t.Fatalf("copy: %s from %q, want %s from shared", img.Digest, img.Source, ti.manifest.Digest)
	}
	root, err := user.Rootfs(ctx, img, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(root, "bin/hello")); got != "hello world\n" {
		t.Fatalf("rootfs of the copy: %q", got)
	}
	if _, err := ro.CopyImage(ctx, user, "base", "x"); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("copy into a read-only store: %v", err)
	}
	if _, err := user.CopyImage(ctx, ro, "nope", "shared"); !errdefs.IsNotFound(err) {
		t.Fatalf("copy of a missing image: %v", err)
	}
	if _, err := OpenReadOnly(t.TempDir()); !errdefs.IsNotFound(err) {
		t.Fatalf("read-only open of an empty directory: %v", err)
	}
}

// A blob in the shared store that does not match its digest is refused and
// nothing is tagged.
func TestSharedStoreCorruptBlob(t *testing.T) {
	ctx := context.Background()
	own := newStore(t)
	ar, _ := simpleArchive(t, layer{tar: baseLayer(t), compression: "gzip"})
	importBytes(t, own, "base", ar)
	dir := filepath.Join(t.TempDir(), "shared")
	shared, err := OpenShared(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := shared.CopyImage(ctx, own, "base", SourceImport); err != nil {
		t.Fatal(err)
	}
	img, err := own.Get(ctx, "base")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "oci/blobs/sha256", img.Layers[0].Digest.Encoded())
	b := []byte(readFile(t, p))
	b[len(b)/2] ^= 0xff
	os.Chmod(p, 0o644)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	ro, err := OpenReadOnly(dir)
	if err != nil {
		t.Fatal(err)
	}
	user := newStore(t)
	if _, err := user.CopyImage(ctx, ro, "base", "shared"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("copy of a corrupt layer: %v", err)
	}
	if _, err := user.Get(ctx, "base"); !errdefs.IsNotFound(err) {
		t.Fatalf("a failed copy tagged the image: %v", err)
	}
}
