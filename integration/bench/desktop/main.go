// Command desktop measures the desktop template from the CLI: create →
// first screenshot, restored from the warm template and booted cold
// (a host directory mounted, which no checkpoint holds, so the start
// command runs); a screenshot's round trip in a running desktop (scrot
// in the sandbox, the PNG read out); and a CDP Runtime.evaluate round
// trip through `hutch browser`'s endpoint (the sandbox's kernel, the
// rewriting proxy) beside the same call on the host's own Chromium over
// its DevTools port. It writes its own section of docs/benchmarks.md.
// Run it through `make bench` (as root, after `make desktop-image`).
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"

	"hutch.dev/hutch/integration/bench/benchdoc"
	"hutch.dev/hutch/integration/bench/benchexit"
)

type bench struct {
	bin, root string
}

func (b *bench) hutch(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(b.bin, "hutch"), append([]string{"--root", b.root}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("hutch %s: %v: %s", strings.Join(args, " "), err, errb.String())
	}
	return out.String(), nil
}

func (b *bench) must(args ...string) string {
	out, err := b.hutch(args...)
	if err != nil {
		benchexit.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// screenshot takes one in sandbox id and reads the PNG out.
func (b *bench) screenshot(id string) int {
	out := b.must("exec", id, "--", "sh", "-c", "scrot --pointer --overwrite /tmp/bench.png && cat /tmp/bench.png")
	if !strings.HasPrefix(out, "\x89PNG") {
		benchexit.Fatalf("sandbox %s: the screenshot is not a PNG", id)
	}
	return len(out)
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000) }

func main() {
	bin := flag.String("bin", "bin", "directory holding hutch, runsc and images/desktop.tar")
	out := flag.String("out", "", "markdown file whose desktop section is (re)written; empty: stdout only")
	createN := flag.Int("create-runs", 5, "creates measured per kind")
	rtN := flag.Int("runs", 20, "screenshot round trips measured")
	cdpN := flag.Int("cdp-runs", 200, "Runtime.evaluate round trips measured per side")
	flag.Parse()
	started := time.Now()
	abs, err := filepath.Abs(*bin)
	if err != nil {
		benchexit.Fatal(err)
	}
	tmp, err := os.MkdirTemp("", "hutch-bench-desktop-")
	if err != nil {
		benchexit.Fatal(err)
	}
	b := &bench{bin: abs, root: filepath.Join(tmp, "root")}
	cleanup := func() {
		if ids, err := b.hutch("ls", "-q"); err == nil {
			for _, id := range strings.Fields(ids) {
				b.hutch("rm", "-f", id) //nolint:errcheck // best effort at exit
			}
		}
		os.RemoveAll(tmp)
	}
	benchexit.AtExit(cleanup)
	defer cleanup()

	progress("importing the desktop template")
	t0 := time.Now()
	b.must("image", "import", "desktop", filepath.Join(abs, "images", "desktop.tar"))
	imported := time.Since(t0)
	t0 = time.Now()
	b.must("rm", "-f", b.must("create", "--image", "desktop"))
	checkpointed := time.Since(t0)

	createShot := func(args ...string) (create, first time.Duration) {
		t0 := time.Now()
		id := b.must(append([]string{"create", "--image", "desktop"}, args...)...)
		create = time.Since(t0)
		b.screenshot(id)
		first = time.Since(t0)
		b.must("rm", "-f", id)
		return create, first
	}
	var warmC, warmF, coldC, coldF []time.Duration
	mount := filepath.Join(tmp, "mnt")
	if err := os.MkdirAll(mount, 0o755); err != nil {
		benchexit.Fatal(err)
	}
	for i := 0; i < *createN; i++ {
		progress(fmt.Sprintf("create → first screenshot %d/%d", i+1, *createN))
		c, f := createShot()
		warmC, warmF = append(warmC, c), append(warmF, f)
		c, f = createShot("-v", mount+":/mnt/bench")
		coldC, coldF = append(coldC, c), append(coldF, f)
	}

	progress("screenshot round trips")
	id := b.must("create", "--image", "desktop")
	size := b.screenshot(id)
	var shots []time.Duration
	for i := 0; i < *rtN; i++ {
		t0 := time.Now()
		b.screenshot(id)
		shots = append(shots, time.Since(t0))
	}

	progress("CDP through hutch browser")
	inSandbox, version, err := cdpRoundTrips(b, id, *cdpN)
	if err != nil {
		benchexit.Fatal(err)
	}
	progress("CDP on the host's Chromium")
	onHost, hostVersion, err := hostCDP(filepath.Join(tmp, "host-profile"), *cdpN)
	if err != nil {
		benchexit.Fatal(err)
	}

	var body strings.Builder
	fmt.Fprintf(&body, "## Desktop and browser\n\n")
	fmt.Fprintf(&body, "`go run ./integration/bench/desktop -bin bin -out docs/benchmarks.md` (part of `make bench`), %s, %d CPUs, run on %s in %s. "+
		"The desktop template imported in %s; its checkpoint (the X server and XFCE up) made by the first create in %s. Medians.\n\n",
		runtime.GOARCH, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02"), time.Since(started).Round(time.Second), imported.Round(time.Millisecond), checkpointed.Round(time.Millisecond))
	fmt.Fprintf(&body, "| desktop sandbox, from the CLI | create | create → first screenshot read out |\n| --- | --- | --- |\n")
	fmt.Fprintf(&body, "| restored from the warm template (%d runs) | %s ms | %s ms |\n", *createN, ms(median(warmC)), ms(median(warmF)))
	fmt.Fprintf(&body, "| booted cold: a host directory mounted, the start command run (%d runs) | %s ms | %s ms |\n\n", *createN, ms(median(coldC)), ms(median(coldF)))
	fmt.Fprintf(&body, "| round trip | median | p90 |\n| --- | --- | --- |\n")
	fmt.Fprintf(&body, "| screenshot of 1024x768 (scrot in the sandbox, %d-byte PNG read out by `hutch exec`), %d runs | %s ms | %s ms |\n", size, *rtN, ms(median(shots)), ms(pct(shots, 90)))
	fmt.Fprintf(&body, "| CDP `Runtime.evaluate` through `hutch browser` (the sandbox's %s), %d runs | %s ms | %s ms |\n", version, *cdpN, ms(median(inSandbox)), ms(pct(inSandbox, 90)))
	fmt.Fprintf(&body, "| the same on the host's own %s over its DevTools port, %d runs | %s ms | %s ms |\n\n", hostVersion, *cdpN, ms(median(onHost)), ms(pct(onHost, 90)))
	fmt.Fprintf(&body, "The cold create waits for the template's ready check (XFCE up and the desktop drawn), as the warm one's checkpoint did. "+
		"The CDP rows are one chromedp client evaluating `1+1` in a page; through hutch each call crosses the proxy and the sandbox's kernel. "+
		"Through `hutch serve` the path adds its TLS listener and port routing (not measured here).\n")
	fmt.Print(body.String())
	if *out != "" {
		if err := benchdoc.WriteSection(*out, "desktop", body.String()); err != nil {
			benchexit.Fatal(err)
		}
	}
}

func pct(d []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[(len(s)-1)*p/100]
}

// cdpRoundTrips starts `hutch browser ID` and times Runtime.evaluate
// through the URL it prints.
func cdpRoundTrips(b *bench, id string, n int) ([]time.Duration, string, error) {
	cmd := exec.Command(filepath.Join(b.bin, "hutch"), "--root", b.root, "browser", id)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		return nil, "", fmt.Errorf("hutch browser printed no URL: %w", err)
	}
	return evaluate(strings.TrimSpace(line), n)
}

// hostCDP starts the host's Chromium headless with DevTools on a free
// port and times the same calls.
func hostCDP(profile string, n int) ([]time.Duration, string, error) {
	path, err := exec.LookPath("chromium")
	if err != nil {
		return nil, "", fmt.Errorf("the host's chromium: %w", err)
	}
	cmd := exec.Command(path, "--headless=new", "--no-sandbox", "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
		"--user-data-dir="+profile, "--no-first-run", "about:blank")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	re := regexp.MustCompile(`DevTools listening on (ws://\S+)`)
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			go func() {
				for sc.Scan() {
				}
			}()
			return evaluate(m[1], n)
		}
	}
	return nil, "", fmt.Errorf("the host's chromium printed no DevTools URL")
}

// evaluate connects chromedp to the browser at wsURL and times n
// evaluations of 1+1 in a new page.
func evaluate(wsURL string, n int) ([]time.Duration, string, error) {
	actx, cancel := remote.NewAllocator(context.Background(), wsURL, remote.NoModifyURL)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, stop := context.WithTimeout(ctx, 5*time.Minute)
	defer stop()
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[int]("1+1")); err != nil {
		return nil, "", fmt.Errorf("%s: %w", wsURL, err)
	}
	version, err := chromedp.Run(ctx, chromedp.Evaluate[string]("navigator.userAgent.match(/Chrome\\/[0-9.]+/)[0]"))
	if err != nil {
		return nil, "", err
	}
	var out []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[int]("1+1"))
		if err != nil {
			return nil, "", err
		}
		out = append(out, time.Since(t0))
		if v != 2 {
			return nil, "", fmt.Errorf("1+1 evaluated to %d", v)
		}
	}
	return out, strings.Replace(version, "Chrome/", "Chromium ", 1), nil
}

func progress(s string) { fmt.Fprintf(os.Stderr, "desktop: %s\n", s) }
