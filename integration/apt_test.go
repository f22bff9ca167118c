package integration

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// aptSource is one Debian package source of the host: a repository URI
// and one suite of it.
type aptSource struct {
	uri        string
	suite      string
	components []string
}

// hostAptSources reads the package sources apt on this host uses:
// /etc/apt/sources.list and the *.list (one-line) and *.sources (deb822)
// files of /etc/apt/sources.list.d. Only binary ("deb") sources over
// http or https count; disabled deb822 stanzas do not.
func hostAptSources(t *testing.T) []aptSource {
	t.Helper()
	files := []string{"/etc/apt/sources.list"}
	for _, pat := range []string{"*.list", "*.sources"} {
		m, _ := filepath.Glob(filepath.Join("/etc/apt/sources.list.d", pat))
		files = append(files, m...)
	}
	var srcs []aptSource
	for _, f := range files {
		b, err := os.ReadFile(f)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(f, ".sources") {
			srcs = append(srcs, parseDeb822Sources(string(b))...)
		} else {
			srcs = append(srcs, parseOneLineSources(string(b))...)
		}
	}
	return slices.DeleteFunc(srcs, func(s aptSource) bool {
		u, err := url.Parse(s.uri)
		return err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == ""
	})
}

// parseOneLineSources reads "deb [options] URI SUITE COMPONENT..." lines.
func parseOneLineSources(text string) []aptSource {
	var srcs []aptSource
	for _, line := range strings.Split(text, "\n") {
		line, _, _ = strings.Cut(line, "#")
		// Options in brackets may hold spaces: drop them first.
		if i := strings.Index(line, "["); i >= 0 {
			if j := strings.Index(line[i:], "]"); j >= 0 {
				line = line[:i] + " " + line[i+j+1:]
			}
		}
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		srcs = append(srcs, aptSource{uri: f[1], suite: f[2], components: f[3:]})
	}
	return srcs
}

// parseDeb822Sources reads deb822 stanzas (Types, URIs, Suites,
// Components, Enabled).
func parseDeb822Sources(text string) []aptSource {
	var srcs []aptSource
	flush := func(st map[string]string) {
		if len(st) == 0 || strings.EqualFold(st["enabled"], "no") || !slices.Contains(strings.Fields(st["types"]), "deb") {
			return
		}
		for _, u := range strings.Fields(st["uris"]) {
			for _, s := range strings.Fields(st["suites"]) {
				srcs = append(srcs, aptSource{uri: u, suite: s, components: strings.Fields(st["components"])})
			}
		}
	}
	st := map[string]string{}
	key := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "#"):
		case strings.TrimSpace(line) == "":
			flush(st)
			st, key = map[string]string{}, ""
		case line[0] == ' ' || line[0] == '\t':
			if key != "" {
				st[key] += " " + strings.TrimSpace(line)
			}
		default:
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			key = strings.ToLower(strings.TrimSpace(k))
			st[key] = strings.TrimSpace(v)
		}
	}
	flush(st)
	return srcs
}

// hostAptProxy is the HTTP proxy apt on this host goes through
// (Acquire::http::Proxy, else Acquire::https::Proxy), or "".
func hostAptProxy(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("apt-config", "dump").Output()
	if err != nil {
		t.Fatalf("apt-config dump: %v", err)
	}
	set := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^Acquire::(https?)::Proxy "([^"]*)";$`).FindAllStringSubmatch(string(out), -1) {
		set[m[1]] = m[2]
	}
	for _, k := range []string{"http", "https"} {
		if p := set[k]; p != "" && !strings.EqualFold(p, "DIRECT") {
			return p
		}
	}
	return ""
}

// hostPort is u's host and port, the scheme's port if it names none.
func hostPort(u *url.URL) (string, string) {
	if p := u.Port(); p != "" {
		return u.Hostname(), p
	}
	if u.Scheme == "https" {
		return u.Hostname(), "443"
	}
	return u.Hostname(), "80"
}

// `sudo apt-get install` as the default image's user, in a sandbox whose
// network allows only the Debian mirror the host's apt uses (read from
// the host's apt sources now; or the host's apt proxy if it has one), with
// the host's own CA certificates for mirrors and proxies that need them.
func TestAptInstallAllowMirror(t *testing.T) {
	requiresRoot(t)
	srcs := hostAptSources(t)
	if len(srcs) == 0 {
		t.Skip("the host has no http or https apt sources in /etc/apt/sources.list or /etc/apt/sources.list.d: no Debian mirror to allow")
	}
	e := newEnv(t)
	e.root = baseArchive(t)

	// The image's release picks the host's sources of the same release
	// (other repositories of the host have other suites).
	probe := e.create("--image", "base", "--net", "none")
	codename := strings.TrimSpace(e.ok("exec", probe, "--", "sh", "-c", ". /etc/os-release && echo $VERSION_CODENAME"))
	e.ok("rm", "-f", probe)
	srcs = slices.DeleteFunc(srcs, func(s aptSource) bool {
		return s.suite != codename && !strings.HasPrefix(s.suite, codename+"-")
	})
	if len(srcs) == 0 {
		t.Skipf("none of the host's apt sources is for Debian %s, the default image's release", codename)
	}

	var sourcesList strings.Builder
	var allow []string
	add := func(host string, ports ...string) {
		for _, p := range ports {
			if r := net.JoinHostPort(host, p); !slices.Contains(allow, r) {
				allow = append(allow, r)
			}
		}
	}
	for _, s := range srcs {
		sourcesList.WriteString("deb " + s.uri + " " + s.suite + " " + strings.Join(s.components, " ") + "\n")
	}
	var aptConf string
	if p := hostAptProxy(t); p != "" {
		u, err := url.Parse(p)
		if err != nil || u.Hostname() == "" {
			t.Fatalf("apt proxy %q of the host: not a URL", p)
		}
		if ip := net.ParseIP(u.Hostname()); u.Hostname() == "localhost" || (ip != nil && ip.IsLoopback()) {
			t.Skipf("the host's apt proxy %s is on its loopback, which no sandbox reaches", p)
		}
		host, port := hostPort(u)
		add(host, port)
		aptConf = "Acquire::http::Proxy \"" + p + "\";\nAcquire::https::Proxy \"" + p + "\";\n"
	} else {
		for _, s := range srcs {
			u, _ := url.Parse(s.uri)
			host, port := hostPort(u)
			add(host, "80", "443", port)
		}
	}
	args := []string{"--image", "base", "--net", "allow"}
	for _, a := range allow {
		args = append(args, "--allow", a)
	}
	cas, _ := filepath.Glob("/usr/local/share/ca-certificates/*.crt")
	for _, ca := range cas {
		args = append(args, "--ca-cert", ca)
	}
	t.Logf("allowing %v", allow)
	id := e.create(args...)
	t.Cleanup(func() { e.run(nil, "rm", "-f", id) })

	const pkg, prog = "cowsay", "/usr/games/cowsay"
	if r := e.run(nil, "exec", id, "--", "dpkg", "-s", pkg); r.code == 0 {
		t.Fatalf("%s is in the default image already; the test needs a package that is not", pkg)
	}
	// The image's own sources name Debian's default mirror; use the host's.
	setup := "cat > /etc/apt/sources.list && rm -f /etc/apt/sources.list.d/*"
	if r := e.run(strings.NewReader(sourcesList.String()), "exec", "-i", "-u", "root", id, "--", "sh", "-c", setup); r.code != 0 {
		t.Fatalf("writing the host's sources into the sandbox: %s", r)
	}
	if aptConf != "" {
		if r := e.run(strings.NewReader(aptConf), "exec", "-i", "-u", "root", id, "--", "sh", "-c", "cat > /etc/apt/apt.conf.d/90proxy"); r.code != 0 {
			t.Fatalf("writing the host's apt proxy into the sandbox: %s", r)
		}
	}

	opts := "-q -o Acquire::Retries=2 -o Acquire::http::Timeout=30 -o Acquire::https::Timeout=30"
	script := "set -e; id -un; sudo -n apt-get " + opts + " update; sudo -n env DEBIAN_FRONTEND=noninteractive apt-get " + opts +
		" install -y --no-install-recommends " + pkg + "; " + prog + " moo"
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := e.cmd(nil, "exec", id, "--", "bash", "-c", script)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop := context.AfterFunc(ctx, func() { cmd.Process.Kill() })
	err := cmd.Wait()
	stop()
	if ctx.Err() != nil {
		t.Fatalf("apt-get update and install did not finish in time\nstdout: %s\nstderr: %s", out.String(), errb.String())
	}
	if err != nil {
		t.Fatalf("sudo apt-get install %s as user, allowing %v: %v\nstdout: %s\nstderr: %s", pkg, allow, err, out.String(), errb.String())
	}
	if !strings.HasPrefix(out.String(), "user\n") || !strings.Contains(out.String(), "< moo >") {
		t.Fatalf("as user, sudo apt-get install %s, then %s moo:\n%s\nstderr: %s", pkg, prog, out.String(), errb.String())
	}
}

// The host's apt sources are read as apt reads them: one-line entries
// with options, deb822 stanzas with several URIs and suites, no deb-src,
// no disabled stanza.
func TestParseAptSources(t *testing.T) {
	one := parseOneLineSources("# comment\ndeb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main contrib\n" +
		"deb-src http://mirror.example/debian bookworm main\ndeb https://sec.example/debian-security bookworm-security main # tail\n")
	want := []aptSource{
		{uri: "http://mirror.example/debian", suite: "bookworm", components: []string{"main", "contrib"}},
		{uri: "https://sec.example/debian-security", suite: "bookworm-security", components: []string{"main"}},
	}
	if !slices.EqualFunc(one, want, sameSource) {
		t.Fatalf("one-line sources: %+v, want %+v", one, want)
	}
	deb822 := parseDeb822Sources("Types: deb deb-src\n# a comment\nURIs: http://a.example/debian\n http://b.example/debian\n" +
		"Suites: bookworm bookworm-updates\nComponents: main\n\nTypes: deb\nURIs: http://off.example/debian\nSuites: bookworm\n" +
		"Components: main\nEnabled: no\n\nTypes: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\nComponents: main\n")
	want = nil
	for _, u := range []string{"http://a.example/debian", "http://b.example/debian"} {
		for _, s := range []string{"bookworm", "bookworm-updates"} {
			want = append(want, aptSource{uri: u, suite: s, components: []string{"main"}})
		}
	}
	if !slices.EqualFunc(deb822, want, sameSource) {
		t.Fatalf("deb822 sources: %+v, want %+v", deb822, want)
	}
}

func sameSource(a, b aptSource) bool {
	return a.uri == b.uri && a.suite == b.suite && slices.Equal(a.components, b.components)
}
