// Command portforward measures sbx's port forwarding against a direct
// loopback connection, and writes the result into its own section of
// docs/benchmarks.md. Run it through `make bench` (as root).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"sbx.dev/sbx/integration/bench/benchdoc"
	"sbx.dev/sbx/integration/bench/benchexit"
)

const (
	latencyRuns    = 200
	throughputRuns = 5
	bigSize        = 64 << 20
	execRuns       = 20
)

var bin string

func sbx(root string, args ...string) string {
	c := exec.Command(filepath.Join(bin, "sbx"), args...)
	c.Env = append(os.Environ(), "SBX_ROOT="+root)
	out, err := c.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		benchexit.Fatalf("sbx %s: %v: %s", strings.Join(args, " "), err, msg)
	}
	return string(out)
}

// client opens a new connection per request, as a browser's first
// request or a health check does.
var client = &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}

func fetch(url string) int64 {
	resp, err := client.Get(url)
	if err != nil {
		benchexit.Fatal(err)
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil || resp.StatusCode != 200 {
		benchexit.Fatalf("GET %s: %s %v", url, resp.Status, err)
	}
	return n
}

func timeIt(n int, f func()) []time.Duration {
	var ds []time.Duration
	for i := 0; i < n; i++ {
		t := time.Now()
		f()
		ds = append(ds, time.Since(t))
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds
}

func pct(ds []time.Duration, p float64) time.Duration { return ds[int(float64(len(ds)-1)*p)] }

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

func mibps(ds []time.Duration) string {
	return fmt.Sprintf("%.0f MiB/s", float64(bigSize)/(1<<20)/pct(ds, 0.5).Seconds())
}

func main() {
	flag.StringVar(&bin, "bin", "bin", "directory of the built sbx, sbx-init, runsc and images")
	out := flag.String("out", "docs/benchmarks.md", "benchmark document to update")
	flag.Parse()
	root, err := os.MkdirTemp("", "sbx-bench-pf-")
	if err != nil {
		benchexit.Fatal(err)
	}
	defer os.RemoveAll(root)
	benchexit.AtExit(func() {
		// Whatever sandbox the run had made.
		c := exec.Command(filepath.Join(bin, "sbx"), "ls", "-q")
		c.Env = append(os.Environ(), "SBX_ROOT="+root)
		out, _ := c.Output()
		for _, id := range strings.Fields(string(out)) {
			rm := exec.Command(filepath.Join(bin, "sbx"), "rm", "-f", id)
			rm.Env = c.Env
			rm.Run() //nolint:errcheck // best effort on the way out
		}
		os.RemoveAll(root)
	})

	id := strings.TrimSpace(sbx(root, "create", "--image", "busybox", "-p", "0:8080"))
	defer sbx(root, "rm", "-f", id)
	var rec struct {
		Ports []struct{ HostPort int } `json:"ports"`
	}
	if err := json.Unmarshal([]byte(sbx(root, "inspect", id)), &rec); err != nil {
		benchexit.Fatal(err)
	}
	sbx(root, "exec", id, "--", "sh", "-c", fmt.Sprintf("mkdir -p /tmp/www && echo hello > /tmp/www/index.html && head -c %d /dev/zero > /tmp/www/big", bigSize))
	sbx(root, "exec", "-d", id, "--", "httpd", "-f", "-p", "8080", "-h", "/tmp/www")
	fwd := fmt.Sprintf("http://127.0.0.1:%d", rec.Ports[0].HostPort)

	// The same files from a server on the host, straight over loopback.
	dir := filepath.Join(root, "www")
	os.Mkdir(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "index.html"), []byte("hello\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "big"), make([]byte, bigSize), 0o644)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		benchexit.Fatal(err)
	}
	go http.Serve(l, http.FileServer(http.Dir(dir)))
	direct := "http://" + l.Addr().String()

	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if resp, err := client.Get(fwd + "/"); err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			benchexit.Fatal("httpd in the sandbox never answered")
		}
	}
	fetch(fwd + "/big") // warm up

	latDirect := timeIt(latencyRuns, func() { fetch(direct + "/") })
	latFwd := timeIt(latencyRuns, func() { fetch(fwd + "/") })
	bigDirect := timeIt(throughputRuns, func() { fetch(direct + "/big") })
	bigFwd := timeIt(throughputRuns, func() { fetch(fwd + "/big") })
	execs := timeIt(execRuns, func() { sbx(root, "exec", id, "--", "true") })

	var b strings.Builder
	fmt.Fprintf(&b, "### Port forwarding (`-p`, `sbx port-forward`)\n\n")
	fmt.Fprintf(&b, "`go run ./integration/bench/portforward`, %s, %d CPUs, %s. ", time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.GOOS+"/"+runtime.GOARCH)
	fmt.Fprintf(&b, "HTTP GETs from the host, a new TCP connection each. *Direct*: a Go file server on the host's loopback. *Forwarded*: busybox `httpd` inside a sandbox with `--net none`, through `-p` (one yamux session over one exec of the agent, made on the sandbox's control socket like every plain exec and shared by every connection). The forwarded figures include gVisor's netstack and busybox httpd, not only the forwarder. The machine is shared: compare columns, not runs.\n\n")
	fmt.Fprintf(&b, "| measure | direct | forwarded |\n| --- | --- | --- |\n")
	fmt.Fprintf(&b, "| small GET, median of %d | %s | %s |\n", latencyRuns, ms(pct(latDirect, 0.5)), ms(pct(latFwd, 0.5)))
	fmt.Fprintf(&b, "| small GET, p95 | %s | %s |\n", ms(pct(latDirect, 0.95)), ms(pct(latFwd, 0.95)))
	fmt.Fprintf(&b, "| %d MiB GET, median of %d | %s | %s |\n\n", bigSize>>20, throughputRuns, mibps(bigDirect), mibps(bigFwd))
	fmt.Fprintf(&b, "One exec per connection was the other design: an `sbx exec -- true` takes %s (median of %d), which each new connection would have paid before its first byte.\n", ms(pct(execs, 0.5)), execRuns)
	if err := benchdoc.WriteSection(*out, "portforward", b.String()); err != nil {
		benchexit.Fatal(err)
	}
	fmt.Print(b.String())
}
