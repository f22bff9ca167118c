// Command hutch-mkimage writes the busybox test image as an OCI archive,
// without network access: hutch-mkimage -busybox /bin/busybox -o busybox.tar
//
// With -bootstrap it writes the Debian root filesystem of the default image
// instead, installed by mmdebstrap from Debian's packages (as root):
// hutch-mkimage -bootstrap -o bookworm-rootfs.tar
// With -pause PROGRAM it writes a CRI pause image instead: busybox plus
// PROGRAM as /pause, the entrypoint (a static program that waits for
// SIGTERM, such as hutch-init). With -add SRC:DST (repeatable) it adds
// files on top of busybox, with -entrypoint and -cmd for the image's
// config: how `make installer-image` makes the Kubernetes node installer.
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/containerd/log"

	"hutch.dev/hutch/buildimg"
	"hutch.dev/hutch/overlay"
)

func main() {
	busybox := flag.String("busybox", "/bin/busybox", "statically linked busybox binary")
	out := flag.String("o", "busybox.tar", "output OCI archive")
	name := flag.String("name", "busybox:latest", "image name recorded in the archive")
	bootstrap := flag.Bool("bootstrap", false, "write the default image's Debian root filesystem (mmdebstrap)")
	pause := flag.String("pause", "", "static program to add as /pause, the entrypoint (a CRI pause image)")
	entrypoint := flag.String("entrypoint", "", "the image's entrypoint, words separated by spaces")
	cmd := flag.String("cmd", "", "the image's default arguments, words separated by spaces")
	var files adds
	flag.Var(&files, "add", "SRC:DST: add the file SRC as DST, keeping its mode (repeatable)")
	flag.Parse()
	// The content store warns on filesystems without fs-verity; not news here.
	_ = log.SetLevel("error")
	if *bootstrap {
		if err := runBootstrap(context.Background(), *out); err != nil {
			fmt.Fprintln(os.Stderr, "hutch-mkimage:", err)
			os.Exit(1)
		}
		return
	}
	img := image{files: files, entrypoint: strings.Fields(*entrypoint), cmd: strings.Fields(*cmd)}
	if *pause != "" {
		img.files = append(img.files, [2]string{*pause, "/pause"})
		img.entrypoint, img.cmd = []string{"/pause"}, nil
	}
	if err := run(context.Background(), *busybox, img, *name, *out); err != nil {
		fmt.Fprintln(os.Stderr, "hutch-mkimage:", err)
		os.Exit(1)
	}
}

// adds collects -add SRC:DST flags.
type adds [][2]string

func (a *adds) String() string { return fmt.Sprint(*a) }

func (a *adds) Set(s string) error {
	src, dst, ok := strings.Cut(s, ":")
	if !ok || src == "" || !path.IsAbs(dst) {
		return fmt.Errorf("-add %q: want SRC:/ABSOLUTE/DST", s)
	}
	*a = append(*a, [2]string{src, dst})
	return nil
}

// image is what goes on top of busybox: files, and the config's
// entrypoint and arguments (busybox's when none).
type image struct {
	files           adds
	entrypoint, cmd []string
}

// run builds the image in a scratch store and exports it to out atomically.
func run(ctx context.Context, busybox string, top image, name, out string) error {
	layer, err := overlay.BusyboxLayer(busybox)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "hutch-mkimage-")
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
	if len(top.files) > 0 {
		base = "base"
	}
	img, err := s.Commit(ctx, overlay.CommitOptions{
		Name: base, Layer: bytes.NewReader(layer), Config: &cfg, History: "hutch-mkimage busybox",
	})
	if err != nil {
		return err
	}
	if len(top.files) > 0 {
		fl, err := filesLayer(top.files)
		if err != nil {
			return err
		}
		fcfg := overlay.BusyboxConfig()
		if top.entrypoint != nil {
			fcfg.Entrypoint, fcfg.Cmd = top.entrypoint, top.cmd
		}
		if _, err := s.Commit(ctx, overlay.CommitOptions{
			Name: name, Parent: &img, Layer: bytes.NewReader(fl), Config: &fcfg, History: "hutch-mkimage files",
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
	tmp, err := os.MkdirTemp(filepath.Dir(out), ".hutch-mkimage-")
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

// filesLayer is a layer holding each file at its destination, with its
// parent directories, owned by root, keeping the file's mode.
func filesLayer(files adds) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f[0])
		if err != nil {
			return nil, err
		}
		fi, err := os.Stat(f[0])
		if err != nil {
			return nil, err
		}
		mtime := fi.ModTime().UTC().Truncate(1e9)
		dst := strings.TrimPrefix(path.Clean(f[1]), "/")
		var parents []string
		for d := path.Dir(dst); d != "." && !dirs[d]; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
			dirs[d] = true
		}
		for _, d := range parents {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: mtime}); err != nil {
				return nil, err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: dst, Mode: int64(fi.Mode().Perm()), Size: int64(len(b)), ModTime: mtime}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
