// Command sbx-mkimage writes the busybox test image as an OCI archive,
// without network access: sbx-mkimage -busybox /bin/busybox -o busybox.tar
//
// With -bootstrap it writes the Debian root filesystem of the default image
// instead, installed by mmdebstrap from Debian's packages (as root):
// sbx-mkimage -bootstrap -o bookworm-rootfs.tar
// With -pause PROGRAM it writes a CRI pause image instead: busybox plus
// PROGRAM as /pause, the entrypoint (a static program that waits for
// SIGTERM, such as sbx-init).
package main

import (
	"archive/tar"
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
	pause := flag.String("pause", "", "static program to add as /pause, the entrypoint (a CRI pause image)")
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
	if err := run(context.Background(), *busybox, *pause, *name, *out); err != nil {
		fmt.Fprintln(os.Stderr, "sbx-mkimage:", err)
		os.Exit(1)
	}
}

// run builds the image in a scratch store and exports it to out atomically.
func run(ctx context.Context, busybox, pause, name, out string) error {
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
	base := name
	if pause != "" {
		base = "base"
	}
	img, err := s.Commit(ctx, overlay.CommitOptions{
		Name: base, Layer: bytes.NewReader(layer), Config: &cfg, History: "sbx-mkimage busybox",
	})
	if err != nil {
		return err
	}
	if pause != "" {
		pl, err := pauseLayer(pause)
		if err != nil {
			return err
		}
		pcfg := overlay.BusyboxConfig()
		pcfg.Entrypoint, pcfg.Cmd = []string{"/pause"}, nil
		if _, err := s.Commit(ctx, overlay.CommitOptions{
			Name: name, Parent: &img, Layer: bytes.NewReader(pl), Config: &pcfg, History: "sbx-mkimage pause",
		}); err != nil {
			return err
		}
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

// pauseLayer is a layer holding the program at path as /pause.
func pauseLayer(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	h := &tar.Header{Typeflag: tar.TypeReg, Name: "pause", Mode: 0o755, Size: int64(len(b)), ModTime: fi.ModTime().UTC().Truncate(1e9)}
	if err := tw.WriteHeader(h); err != nil {
		return nil, err
	}
	if _, err := tw.Write(b); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
