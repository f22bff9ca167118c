// Command portforward measures hutch's port forwarding against connections
// that bypass it (to a server on the host's loopback, and to the sandbox's
// own address), and writes the result into its own section of
// docs/benchmarks.md. Run it through `make bench` (as root).
//
// With -serve ADDR DIR it is instead the file server the sandboxes run:
// a Go server that, unlike busybox httpd, starts no process per
// connection, so that the figures are the forwarding's.
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
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing/fstest"
	"time"

	"hutch.dev/hutch/integration/bench/benchdoc"
	"hutch.dev/hutch/integration/bench/benchexit"
)

const (
	latencyRuns    = 200
	throughputRuns = 5
	bigSize        = 64 << 20
	execRuns       = 20
)

var bin string

func hutch(root string, args ...string) string {
	c := exec.Command(filepath.Join(bin, "hutch"), args...)
	c.Env = append(os.Environ(), "HUTCH_ROOT="+root)
	out, err := c.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		benchexit.Fatalf("hutch %s: %v: %s", strings.Join(args, " "), err, msg)
	}
	return string(out)
}

// client opens a new connection per request, as a browser's first
// request or a health check does.
var client = &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}

func fetch(url string) int64 { return fetchWith(client, url) }

// fetchWith GETs url with c and reads the whole body.
func fetchWith(c *http.Client, url string) int64 {
	resp, err := c.Get(url)
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

// timeEach times n rounds of a request to every url, taking the urls in
// turn within a round, so that the machine's load falls on all alike.
func timeEach(n int, urls []string) [][]time.Duration {
	return timeEachWith(n, urls, func(int) *http.Client { return client })
}

// timeEachWith is timeEach with the client clientFor gives each url.
func timeEachWith(n int, urls []string, clientFor func(int) *http.Client) [][]time.Duration {
	ds := make([][]time.Duration, len(urls))
	for i := 0; i < n; i++ {
		for j, u := range urls {
			c := clientFor(j)
			t := time.Now()
			fetchWith(c, u)
			ds[j] = append(ds[j], time.Since(t))
		}
	}
	for _, d := range ds {
		slices.Sort(d)
	}
	return ds
}

func pct(ds []time.Duration, p float64) time.Duration { return ds[int(float64(len(ds)-1)*p)] }

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

func mibps(ds []time.Duration) string {
	return fmt.Sprintf("%.0f MiB/s", float64(bigSize)/(1<<20)/pct(ds, 0.5).Seconds())
}

func main() {
	flag.StringVar(&bin, "bin", "bin", "directory of the built hutch, hutch-init, runsc and images")
	out := flag.String("out", "docs/benchmarks.md", "benchmark document to update")
	serve := flag.String("serve", "", "serve the directory given as argument on this address, and nothing else")
	self := flag.Bool("self", false, "serve on 127.0.0.1 and fetch from it in this process, print the medians as JSON, and nothing else")
	flag.Parse()
	if *serve != "" {
		benchexit.Fatal(http.ListenAndServe(*serve, http.FileServer(http.Dir(flag.Arg(0)))))
	}
	if *self {
		selfFetch()
		return
	}
	root, err := os.MkdirTemp("", "hutch-bench-pf-")
	if err != nil {
		benchexit.Fatal(err)
	}
	// Whatever sandbox the run made goes at its end, and on a fatal
	// error.
	cleanup := func() {
		c := exec.Command(filepath.Join(bin, "hutch"), "ls", "-q")
		c.Env = append(os.Environ(), "HUTCH_ROOT="+root)
		out, _ := c.Output()
		for _, id := range strings.Fields(string(out)) {
			rm := exec.Command(filepath.Join(bin, "hutch"), "rm", "-f", id)
			rm.Env = c.Env
			rm.Run() //nolint:errcheck // best effort on the way out
		}
		os.RemoveAll(root)
	}
	defer cleanup()
	benchexit.AtExit(cleanup)

	// This program, static, is the sandboxes' file server.
	server := filepath.Join(root, "fileserver")
	gb := exec.Command("go", "build", "-o", server, "hutch.dev/hutch/integration/bench/portforward")
	gb.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := gb.CombinedOutput(); err != nil {
		benchexit.Fatalf("build the file server: %v: %s", err, out)
	}

	// Ports in each sandbox: busybox httpd, the Go server on every
	// address, the Go server on 127.0.0.1 only.
	const httpdPort, goPort, loopPort = 8080, 8081, 8082
	type sandbox struct {
		id    string
		ip    string
		ports map[int]int // sandbox port → host port
	}
	start := func(net string, global ...string) sandbox {
		hutch := func(root string, args ...string) string { return hutch(root, append(global, args...)...) }
		id := strings.TrimSpace(hutch(root, "create", "--image", "busybox", "--net", net,
			"-p", fmt.Sprintf("127.0.0.1:0:%d", httpdPort), "-p", fmt.Sprintf("127.0.0.1:0:%d", goPort), "-p", fmt.Sprintf("127.0.0.1:0:%d", loopPort)))
		var rec struct {
			IP    string                         `json:"ip"`
			Ports []struct{ HostPort, Port int } `json:"ports"`
		}
		if err := json.Unmarshal([]byte(hutch(root, "inspect", id)), &rec); err != nil {
			benchexit.Fatal(err)
		}
		sb := sandbox{id: id, ip: rec.IP, ports: map[int]int{}}
		for _, p := range rec.Ports {
			sb.ports[p.Port] = p.HostPort
		}
		hutch(root, "cp", server, id+":/tmp/fileserver")
		hutch(root, "exec", id, "--", "sh", "-c", fmt.Sprintf("mkdir -p /tmp/www && echo hello > /tmp/www/index.html && head -c %d /dev/zero > /tmp/www/big", bigSize))
		hutch(root, "exec", "-d", id, "--", "httpd", "-f", "-p", strconv.Itoa(httpdPort), "-h", "/tmp/www")
		hutch(root, "exec", "-d", id, "--", "/tmp/fileserver", "-serve", fmt.Sprintf("0.0.0.0:%d", goPort), "/tmp/www")
		hutch(root, "exec", "-d", id, "--", "/tmp/fileserver", "-serve", fmt.Sprintf("127.0.0.1:%d", loopPort), "/tmp/www")
		return sb
	}
	open, none := start("open"), start("none")
	// The same with a runsc that cannot forward a port itself: the
	// agent relays.
	relayed := start("none", "--runsc", filepath.Join(bin, "runsc-unpatched"))
	if open.ip == "" {
		benchexit.Fatal("the open sandbox has no address")
	}
	host := func(sb sandbox, port int) string { return fmt.Sprintf("http://127.0.0.1:%d", sb.ports[port]) }

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

	// Columns: the host's loopback; the open sandbox's address, no hutch
	// in between; -p of the open sandbox (direct), of its server on
	// 127.0.0.1 (the agent, after a refused direct dial), of the none
	// sandbox (the agent).
	cols := []string{"host loopback", "sandbox address, no hutch", "`-p`, open", "`-p`, open, server on 127.0.0.1", "`-p`, none", "`-p`, none, through the agent"}
	goURLs := []string{
		"http://" + l.Addr().String(),
		fmt.Sprintf("http://%s:%d", open.ip, goPort),
		host(open, goPort),
		host(open, loopPort),
		host(none, goPort),
		host(relayed, goPort),
	}
	httpdURLs := []string{"", fmt.Sprintf("http://%s:%d", open.ip, httpdPort), host(open, httpdPort), "", host(none, httpdPort), host(relayed, httpdPort)}
	for _, u := range append(slices.Clone(goURLs), httpdURLs...) {
		if u == "" {
			continue
		}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if resp, err := client.Get(u + "/"); err == nil {
				resp.Body.Close()
				break
			}
			if time.Now().After(deadline) {
				benchexit.Fatalf("%s never answered", u)
			}
		}
		fetch(u + "/big") // warm up
	}
	paths := func(us []string, p string) []string {
		var out []string
		for _, u := range us {
			if u != "" {
				out = append(out, u+p)
			}
		}
		return out
	}
	lat := timeEach(latencyRuns, paths(goURLs, "/"))
	// The same on one kept connection per column (HTTP keep-alive).
	kept := make([]*http.Client, len(goURLs))
	for i := range kept {
		kept[i] = &http.Client{Timeout: time.Minute, Transport: &http.Transport{}}
	}
	keptLat := timeEachWith(latencyRuns, paths(goURLs, "/"), func(i int) *http.Client { return kept[i] })
	big := timeEach(throughputRuns, paths(goURLs, "/big"))
	httpd := timeEach(latencyRuns/4, paths(httpdURLs, "/"))
	execs := timeIt(execRuns, func() { hutch(root, "exec", none.id, "--", "true") })
	// The sandbox's address on a kept connection, requests back to
	// back: the sandbox does not idle between them.
	bc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{}}
	fetchWith(bc, goURLs[1]+"/")
	backToBack := timeIt(latencyRuns, func() { fetchWith(bc, goURLs[1]+"/") })
	// A GET with no host in its path: this program serving and fetching
	// on its own 127.0.0.1, on the host and inside the open sandbox.
	var onHost, inSandbox selfResult
	selfOut, err := exec.Command(server, "-self").Output()
	if err != nil {
		benchexit.Fatalf("%s -self: %v", server, err)
	}
	if err := json.Unmarshal(selfOut, &onHost); err != nil {
		benchexit.Fatal(err)
	}
	if err := json.Unmarshal([]byte(hutch(root, "exec", open.id, "--", "/tmp/fileserver", "-self")), &inSandbox); err != nil {
		benchexit.Fatal(err)
	}

	var b strings.Builder
	fmt.Fprintf(&b, "### Port forwarding (`-p`, `hutch port-forward`)\n\n")
	fmt.Fprintf(&b, "`go run ./integration/bench/portforward -bin bin`, %s, %d CPUs, %s. ", time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.GOOS+"/"+runtime.GOARCH)
	fmt.Fprintf(&b, "HTTP GETs from the host, a new TCP connection each; every round takes the columns in turn, so the machine's load falls on all alike. "+
		"The server is a Go file server (this program, with `-serve`), on the host for *host loopback* and in busybox sandboxes for the others; the last row is busybox `httpd`, which forks a process per connection. "+
		"*Sandbox address, no hutch*: the open sandbox's own address dialled from the host, what the direct path adds to is this. "+
		"*`-p`, open*: `--net open`, the forwarder dials the sandbox's address. "+
		"*`-p`, open, server on 127.0.0.1*: a server the sandbox's address does not reach: the dial is refused, and the sandbox's kernel makes the connection, as for *none*. "+
		"*`-p`, none*: `--net none`, through the sandbox's kernel: for each connection one call on the sandbox's control socket (a connection kept while calls follow each other) hands the sentry the client's connection itself, and the sentry connects to the port on its 127.0.0.1 and copies between the two: the host copies nothing (runsc's port forward, docs/decisions/0033 and 0034). "+
		"*`-p`, none, through the agent*: the same with the pinned runsc built without hutch's patches (`bin/runsc-unpatched`), which cannot forward with `--net none`: the agent relays (one yamux session over one exec of the agent, shared by every connection), as every `none` sandbox did before 0033. "+
		"The figures inside a sandbox include gVisor's netstack. "+
		"A request into a sandbox right after one into another sandbox pays for waking it: in each round, *sandbox address, no hutch* and *`-p`, none* come first into their sandboxes, and *`-p`, open* and its server on 127.0.0.1 follow one into the same sandbox, so compare *none* with the sandbox's address. "+
		"The machine is shared: compare columns, not runs.\n\n")
	fmt.Fprintf(&b, "| measure | %s |\n|---|%s\n", strings.Join(cols, " | "), strings.Repeat("---:|", len(cols)))
	row := func(name string, ds [][]time.Duration, have []string, f func([]time.Duration) string) {
		fmt.Fprintf(&b, "| %s |", name)
		i := 0
		for _, u := range have {
			if u == "" {
				fmt.Fprintf(&b, " — |")
				continue
			}
			fmt.Fprintf(&b, " %s |", f(ds[i]))
			i++
		}
		fmt.Fprintln(&b)
	}
	row(fmt.Sprintf("small GET, median of %d", latencyRuns), lat, goURLs, func(d []time.Duration) string { return ms(pct(d, 0.5)) })
	row("small GET, p95", lat, goURLs, func(d []time.Duration) string { return ms(pct(d, 0.95)) })
	row(fmt.Sprintf("small GET on a kept connection, median of %d", latencyRuns), keptLat, goURLs, func(d []time.Duration) string { return ms(pct(d, 0.5)) })
	row(fmt.Sprintf("%d MiB GET, median of %d", bigSize>>20, throughputRuns), big, goURLs, mibps)
	row(fmt.Sprintf("small GET from busybox `httpd`, median of %d", latencyRuns/4), httpd, httpdURLs, func(d []time.Duration) string { return ms(pct(d, 0.5)) })
	us := func(v int64) string { return ms(time.Duration(v) * time.Microsecond) }
	addrNew, addrKept, addrBack := pct(lat[1], 0.5), pct(keptLat[1], 0.5), pct(backToBack, 0.5)
	inKept := time.Duration(inSandbox.Kept) * time.Microsecond
	fmt.Fprintf(&b, "\nWhere a small GET's time goes. With no host in the path (`-self`: one process serves the small file on its own 127.0.0.1 and GETs it, median of %d), it takes %s on a new connection and %s on a kept one on the host, and %s and %s inside the open sandbox (`hutch exec`), where gVisor's netstack carries both ends and every system call of the client and the server goes through the sentry. "+
		"From the host, with no hutch in the path, the sandbox's own address takes %s on a new connection and %s on a kept one when the sandbox idles between requests (the rounds above, which visit the other columns in between), and %s on a kept connection with requests back to back (median of %d). "+
		"So a request that crosses from the host into the sandbox and back pays %s for the crossing (gVisor's packet path between the host's link and its netstack, and the wake-ups of the sentry's and the server's threads), and %s more when the sandbox was idle. ",
		latencyRuns, us(onHost.New), us(onHost.Kept), us(inSandbox.New), us(inSandbox.Kept),
		ms(addrNew), ms(addrKept), ms(addrBack), latencyRuns, ms(addrBack-inKept), ms(addrKept-addrBack))
	if addrKept >= time.Millisecond {
		fmt.Fprintf(&b, "That is more than the aim for `-p`, open (1 ms, on a new connection) before any connection is set up, and with nothing of hutch's in the path: what would close it is in gVisor, not in the forwarder (compare `-p`, open with the sandbox's address above). ")
	}
	fmt.Fprintf(&b, "A client that keeps its connection open skips the set-up (the kept-connection row).\n")
	fmt.Fprintf(&b, "\nOne exec per connection was the other design for `--net none`: a `hutch exec -- true` takes %s (median of %d), which each new connection would have paid before its first byte.\n", ms(pct(execs, 0.5)), execRuns)
	if err := benchdoc.WriteSection(*out, "portforward", b.String()); err != nil {
		benchexit.Fatal(err)
	}
	fmt.Print(b.String())
}

// selfResult is what -self prints: medians of a small GET from this
// process to its own server on 127.0.0.1, a new connection each and on a
// kept connection, in microseconds.
type selfResult struct {
	New, Kept int64
}

// selfFetch serves the small file on 127.0.0.1 and times latencyRuns
// GETs of it from this process, a new connection each, then as many on
// one kept connection: where it runs (the host, a sandbox) is then the
// only difference between two runs.
func selfFetch() {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		benchexit.Fatal(err)
	}
	go http.Serve(l, http.FileServer(http.FS(fstest.MapFS{"index.html": {Data: []byte("hello\n")}})))
	url := "http://" + l.Addr().String() + "/"
	fetch(url) // warm up
	fresh := timeIt(latencyRuns, func() { fetch(url) })
	kc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{}}
	fetchWith(kc, url)
	kept := timeIt(latencyRuns, func() { fetchWith(kc, url) })
	json.NewEncoder(os.Stdout).Encode(selfResult{New: pct(fresh, 0.5).Microseconds(), Kept: pct(kept, 0.5).Microseconds()}) //nolint:errcheck // stdout
}
