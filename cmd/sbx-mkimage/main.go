// Command sbx-mkimage writes the busybox test image as an OCI archive,
// without network access: sbx-mkimage -busybox /bin/busybox -o busybox.tar
//
// With -bootstrap it writes the Debian root filesystem of the default image
// instead, installed by mmdebstrap from Debian's packages (as root):
// sbx-mkimage -bootstrap -o bookworm-rootfs.tar
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/log"

	"sbx.dev/sbx/buildimg"
	"sbx.dev/sbx/overlay"
)

func main() {
	busybox := flag.String("busybox", "/bin/busybox", "statically linked busybox binary")
	out := flag.String("o", "busybox.tar", "output OCI archive")
	name := flag.String("name", "busybox:latest", "image name recorded in the archive")
	bootstrap := flag.Bool("bootstrap", false, "write the default image's Debian root filesystem (mmdebstrap)")
	flag.Parse()
	// The content store warns on filesystems without fs-verity; not news here.
	_ = log.SetLevel("error")
	if *bootstrap {
		if err := runBootstrap(context.Background(), *out); err != nil {
			fmt.Fprintln(os.Stderr, "sbx-mkimage:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(context.Background(), *busybox, *name, *out); err != nil {
		fmt.Fprintln(os.Stderr, "sbx-mkimage:", err)
		os.Exit(1)
	}
}

// run builds the image in a scratch store and exports it to out atomically.
func run(ctx context.Context, busybox, name, out string) error {
	layer, err := overlay.BusyboxLayer(busybox)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "sbx-mkimage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	s, err := overlay.Open(tmp)
	if err != nil {
		return err
	}
	cfg := overlay.BusyboxConfig()
	if _, err := s.Commit(ctx, overlay.CommitOptions{
		Name: name, Layer: bytes.NewReader(layer), Config: &cfg, History: "sbx-mkimage busybox",
	}); err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := s.Export(ctx, name, &buf); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	part := out + ".part"
	if err := os.WriteFile(part, buf.Bytes(), 0o644); err != nil {
		return err
	}
	return os.Rename(part, out)
}

// runBootstrap makes buildimg.RootfsImage in a scratch store under out's
// directory and exports it to out atomically.
func runBootstrap(ctx context.Context, out string) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(out), ".sbx-mkimage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	s, err := overlay.Open(filepath.Join(tmp, "store"))
	if err != nil {
		return err
	}
	if _, err := buildimg.Bootstrap(ctx, s, buildimg.RootfsImage, filepath.Join(tmp, "work"), os.Stderr); err != nil {
		return err
	}
	part := filepath.Join(tmp, "out.tar")
	f, err := os.Create(part)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := s.Export(ctx, buildimg.RootfsImage, f); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(part, out)
}
