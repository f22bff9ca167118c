// Command pull measures `hutch image pull` of a ~200 MiB image from a
// registry on loopback beside containerd's ctr fetching and pulling the
// same image from the same registry, and writes the result into its own
// section of docs/benchmarks.md. Run it through `make bench` (as root).
package main

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/sirupsen/logrus"

	"hutch.dev/hutch/integration/bench/benchdoc"
	"hutch.dev/hutch/integration/bench/benchexit"
)

const (
	// randomSize is the incompressible layer added to busybox.
	randomSize = 200 << 20
	runs       = 5
)

var bin string

func run(env []string, name string, args ...string) string {
	c := exec.Command(name, args...)
	c.Env = append(os.Environ(), env...)
	out, err := c.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		benchexit.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, msg)
	}
	return string(out)
}

func hutch(root string, args ...string) string {
	return run([]string{"HUTCH_ROOT=" + root}, filepath.Join(bin, "hutch"), args...)
}

// startRegistry serves a distribution registry on 127.0.0.1, storing
// blobs under dir.
func startRegistry(dir string) string {
	logrus.SetLevel(logrus.ErrorLevel)
	logrus.SetOutput(io.Discard)
	cfg := &configuration.Configuration{
		Storage: configuration.Storage{"filesystem": configuration.Parameters{"rootdirectory": dir}},
	}
	cfg.HTTP.Secret = "hutch-bench-secret"
	cfg.Log.AccessLog.Disabled = true
	cfg.Log.Level = "error"
	app := handlers.NewApp(context.Background(), cfg)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		benchexit.Fatal(err)
	}
	go http.Serve(l, app) //nolint:errcheck // ends with the program
	return l.Addr().String()
}

// randomLayer writes a gzip'd tar holding one file of n random bytes.
// The data is incompressible, so the gzip stream stores it as it is.
func randomLayer(path string, n int64) {
	f, err := os.Create(path)
	if err != nil {
		benchexit.Fatal(err)
	}
	defer f.Close()
	zw, _ := gzip.NewWriterLevel(f, gzip.NoCompression)
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Name: "random.bin", Mode: 0o644, Size: n, Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
		benchexit.Fatal(err)
	}
	var seed [32]byte
	copy(seed[:], "hutch pull benchmark: random layer")
	if _, err := io.CopyN(tw, rand.NewChaCha8(seed), n); err != nil {
		benchexit.Fatal(err)
	}
	for _, c := range []io.Closer{tw, zw} {
		if err := c.Close(); err != nil {
			benchexit.Fatal(err)
		}
	}
}

// buildImage pushes busybox (with hutch) and busybox plus a random layer
// (go-containerregistry) to the registry at host, and returns the big
// image's reference and its compressed size.
func buildImage(root, host, dir string) (string, int64) {
	small := host + "/bench/busybox:1"
	hutch(root, "image", "push", "--insecure-registry", host, "busybox", small)
	base, err := remote.Image(mustRef(small))
	if err != nil {
		benchexit.Fatal(err)
	}
	layerPath := filepath.Join(dir, "random.tar.gz")
	randomLayer(layerPath, randomSize)
	layer, err := tarball.LayerFromFile(layerPath, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		benchexit.Fatal(err)
	}
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		benchexit.Fatal(err)
	}
	big := host + "/bench/random:1"
	if err := remote.Write(mustRef(big), img); err != nil {
		benchexit.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		benchexit.Fatal(err)
	}
	size := m.Config.Size
	for _, l := range m.Layers {
		size += l.Size
	}
	return big, size
}

func mustRef(s string) name.Reference {
	r, err := name.ParseReference(s, name.Insecure)
	if err != nil {
		benchexit.Fatal(err)
	}
	return r
}

// containerd is a private containerd with its own root, started afresh
// for each timed ctr run so that nothing is fetched already.
type containerd struct {
	dir, sock string
	cmd       *exec.Cmd
}

func startContainerd(parent string) *containerd {
	dir, err := os.MkdirTemp(parent, "containerd-")
	if err != nil {
		benchexit.Fatal(err)
	}
	c := &containerd{dir: dir, sock: filepath.Join(dir, "c.sock")}
	cfg := fmt.Sprintf("version = 3\nroot = %q\nstate = %q\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\", \"io.containerd.cri.v1.runtime\", \"io.containerd.cri.v1.images\"]\n[grpc]\n  address = %q\n[ttrpc]\n  address = %q\n",
		filepath.Join(dir, "root"), filepath.Join(dir, "state"), c.sock, c.sock+".ttrpc")
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(cfg), 0o644); err != nil {
		benchexit.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		benchexit.Fatal(err)
	}
	defer logf.Close()
	c.cmd = exec.Command(filepath.Join(bin, "containerd"), "--config", filepath.Join(dir, "config.toml"))
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.cmd.Start(); err != nil {
		benchexit.Fatal(err)
	}
	benchexit.AtExit(c.stop)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if exec.Command(filepath.Join(bin, "ctr"), "--address", c.sock, "version").Run() == nil {
			return c
		}
		if time.Now().After(deadline) {
			benchexit.Fatalf("containerd did not start: see %s", filepath.Join(dir, "containerd.log"))
		}
	}
}

func (c *containerd) ctr(args ...string) string {
	return run(nil, filepath.Join(bin, "ctr"), append([]string{"--address", c.sock, "-n", "bench"}, args...)...)
}

func (c *containerd) stop() {
	if c.cmd == nil {
		return
	}
	c.cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck // may be gone
	done := make(chan struct{})
	go func() { c.cmd.Wait(); close(done) }() //nolint:errcheck // its status does not matter
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		c.cmd.Process.Kill() //nolint:errcheck // stuck
		<-done
	}
	c.cmd = nil
	// overlayfs snapshots of ctr's pull stay mounted only while in use;
	// unmount whatever is left before removing the directory.
	exec.Command("sh", "-c", "grep -o '"+c.dir+"[^ ]*' /proc/self/mounts | sort -r | xargs -r umount").Run() //nolint:errcheck // best effort
	os.RemoveAll(c.dir)
}

// storedBytes is the size of the blobs in a state root's image store.
func storedBytes(root string) int64 {
	var n int64
	filepath.Walk(filepath.Join(root, "images"), func(_ string, fi os.FileInfo, err error) error { //nolint:errcheck // a missing store holds nothing
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

type side struct {
	label, command string
	times          []time.Duration
}

func main() {
	flag.StringVar(&bin, "bin", "bin", "directory of the built hutch, hutch-init, runsc, containerd, ctr and images")
	out := flag.String("out", "docs/benchmarks.md", "benchmark document to update")
	flag.Parse()
	if os.Geteuid() != 0 {
		benchexit.Fatal("run as root (containerd and hutch's store)")
	}
	for _, f := range []string{"hutch", "containerd", "ctr", "images/busybox.tar"} {
		if _, err := os.Stat(filepath.Join(bin, f)); err != nil {
			benchexit.Fatalf("%s not built (make build containerd-tools): %v", f, err)
		}
	}
	work, err := os.MkdirTemp("", "hutch-bench-pull-")
	if err != nil {
		benchexit.Fatal(err)
	}
	benchexit.AtExit(func() { os.RemoveAll(work) })
	defer os.RemoveAll(work)
	start := time.Now()

	host := startRegistry(filepath.Join(work, "registry"))
	ref, size := buildImage(filepath.Join(work, "builder"), host, work)
	fmt.Fprintf(os.Stderr, "pushed %s (%.1f MiB) in %s\n", ref, float64(size)/(1<<20), time.Since(start).Round(time.Second))

	sides := []*side{
		{label: "`hutch image pull` (fetch, verify, name)", command: "hutch image pull --insecure-registry HOST REF"},
		{label: "`ctr content fetch` (fetch, verify)", command: "ctr content fetch --plain-http REF"},
		{label: "`ctr images pull` (fetch, verify, unpack)", command: "ctr images pull --plain-http REF"},
	}
	do := func(s int, i int) {
		switch s {
		case 0:
			root := filepath.Join(work, fmt.Sprintf("hutch-%d", i))
			t := time.Now()
			hutch(root, "image", "pull", "--insecure-registry", host, ref)
			sides[0].times = append(sides[0].times, time.Since(t))
			if got := storedBytes(root); got < size {
				benchexit.Fatalf("hutch stored %d bytes of a %d-byte image", got, size)
			}
			os.RemoveAll(root)
		default:
			c := startContainerd(work)
			args := []string{"content", "fetch", "--plain-http", ref}
			if s == 2 {
				args = []string{"images", "pull", "--plain-http", ref}
			}
			t := time.Now()
			c.ctr(args...)
			sides[s].times = append(sides[s].times, time.Since(t))
			c.stop()
		}
	}
	// One untimed warm-up of each (page cache of the registry's blobs),
	// then the runs, the order rotating from run to run.
	for s := range sides {
		do(s, -1)
		sides[s].times = nil
	}
	for i := 0; i < runs; i++ {
		for k := range sides {
			do((i+k)%len(sides), i)
		}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "### Image pull from a registry on loopback\n\n")
	fmt.Fprintf(&b, "`make bench` (`go run ./integration/bench/pull`), %s, %d CPUs, %s, as root, in %s. ",
		time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.GOOS+"/"+runtime.GOARCH, time.Since(start).Round(time.Second))
	fmt.Fprintf(&b, "The image is busybox plus one layer of %d MiB of random (incompressible) data, %.1f MiB in all as stored, "+
		"pushed to a distribution registry (filesystem storage) on 127.0.0.1 over plain HTTP, made by the program. "+
		"Each timed run starts empty: `hutch` with a fresh state root, `ctr` against a freshly started containerd v2.4.2 with its own root "+
		"(not timed). `hutch image pull` fetches and verifies every blob and names the image; it unpacks layers at the first create that needs them, "+
		"so `ctr content fetch` is its like; `ctr images pull` also unpacks into overlayfs. One untimed warm-up each, then %d runs each, "+
		"interleaved. The machine is shared: compare rows, not runs.\n\n", randomSize>>20, float64(size)/(1<<20), runs)
	fmt.Fprintf(&b, "| command | median | min | max | MiB/s (median) |\n|---|---:|---:|---:|---:|\n")
	for _, s := range sides {
		ts := append([]time.Duration(nil), s.times...)
		sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
		med := ts[len(ts)/2]
		fmt.Fprintf(&b, "| %s | %.2f s | %.2f s | %.2f s | %.0f |\n", s.label, med.Seconds(), ts[0].Seconds(), ts[len(ts)-1].Seconds(),
			float64(size)/(1<<20)/med.Seconds())
	}
	fmt.Fprintf(&b, "\nCommands, as timed: %s.\n", strings.Join(func() []string {
		var cs []string
		for _, s := range sides {
			cs = append(cs, "`"+s.command+"`")
		}
		return cs
	}(), "; "))
	fmt.Print(b.String())
	if err := benchdoc.WriteSection(*out, "pull", b.String()); err != nil {
		benchexit.Fatal(err)
	}
}
