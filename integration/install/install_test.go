// Package install tests hutch as an operator installs it: `make install`
// and `make uninstall`, the systemd units, and the Debian package in a
// clean Debian 12 root made from the project's bookworm root filesystem
// (install with apt-get, doctor and a sandbox from the installed paths,
// purge). They run as root with HUTCH_INSTALL=1 (make deb-test), which
// builds the package first; they are slow (minutes: apt reaches Debian's
// mirror for the package's dependencies).
package install

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// repo is the hutch checkout the tests run in.
var repo, _ = filepath.Abs("../..")

func requireInstall(t *testing.T) {
	t.Helper()
	if os.Getenv("HUTCH_INSTALL") == "" {
		t.Skip("set HUTCH_INSTALL=1 (make deb-test) to test the install and the package")
	}
	if os.Geteuid() != 0 {
		t.Fatal("the install tests run as root: they install into roots of their own and chroot")
	}
}

func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// snapshot lists every path under root with its type, mode, size and
// link target, leaving out the directories skip names (relative).
func snapshot(t *testing.T, root string, skip ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		for _, s := range skip {
			if rel == s || strings.HasPrefix(rel, s+"/") {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		desc := fi.Mode().String()
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			desc += " -> " + target
		case fi.Mode().IsRegular():
			desc += fmt.Sprintf(" %d", fi.Size())
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// diff is what changed from a to b, one line a path.
func diff(a, b map[string]string) []string {
	var out []string
	for p, d := range a {
		if e, ok := b[p]; !ok {
			out = append(out, "removed "+p)
		} else if e != d {
			out = append(out, fmt.Sprintf("changed %s: %s -> %s", p, d, e))
		}
	}
	for p := range b {
		if _, ok := a[p]; !ok {
			out = append(out, "added "+p+" "+b[p])
		}
	}
	sort.Strings(out)
	return out
}

// TestMakeInstallUninstall installs into a DESTDIR holding a directory
// and a file of its own, checks the installed hutch finds its runsc and
// that the completions, man page and config are the CLI's, then checks
// that uninstall leaves the DESTDIR as it was, and keeps a config the
// operator changed.
func TestMakeInstallUninstall(t *testing.T) {
	requireInstall(t)
	dest := t.TempDir()
	for _, d := range []string{"usr/local/share/man/man1", "etc"} {
		if err := os.MkdirAll(filepath.Join(dest, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dest, "etc/hosts"), []byte("127.0.0.1 localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, dest)
	run(t, repo, nil, "make", "--no-print-directory", "install", "DESTDIR="+dest)
	lib := filepath.Join(dest, "usr/local/lib/hutch")
	hutch := filepath.Join(dest, "usr/local/bin/hutch")
	if target, err := os.Readlink(hutch); err != nil || target != "../lib/hutch/hutch" {
		t.Fatalf("bin/hutch: %q, %v; want a link to ../lib/hutch/hutch", target, err)
	}
	var v struct{ RunscPath, RunscVersion string }
	if err := json.Unmarshal([]byte(run(t, dest, []string{"HUTCH_RUNSC="}, hutch, "--root", filepath.Join(t.TempDir(), "state"), "version", "--format", "json")), &v); err != nil {
		t.Fatal(err)
	}
	if v.RunscPath != filepath.Join(lib, "runsc") || !strings.Contains(v.RunscVersion, "release-") {
		t.Errorf("the installed hutch runs runsc %q (%q); want the one installed beside it", v.RunscPath, v.RunscVersion)
	}
	for file, args := range map[string][]string{
		"usr/local/share/bash-completion/completions/hutch":    {"completion", "bash"},
		"usr/local/share/zsh/site-functions/_hutch":            {"completion", "zsh"},
		"usr/local/share/fish/vendor_completions.d/hutch.fish": {"completion", "fish"},
	} {
		got, err := os.ReadFile(filepath.Join(dest, file))
		if want := run(t, dest, nil, hutch, args...); err != nil || string(got) != want {
			t.Errorf("%s is not what hutch %s prints (%v)", file, strings.Join(args, " "), err)
		}
	}
	if page := gunzip(t, filepath.Join(dest, "usr/local/share/man/man1/hutch.1.gz")); !strings.HasPrefix(page, `.\" Made by`) || !strings.Contains(page, ".SS hutch serve") {
		t.Errorf("the man page is not hutch's: %.200q", page)
	}
	cfg, _ := os.ReadFile(filepath.Join(dest, "etc/hutch/serve.toml"))
	if want, _ := os.ReadFile(filepath.Join(repo, "deploy/host/serve.toml")); !bytes.Equal(cfg, want) {
		t.Errorf("/etc/hutch/serve.toml is not deploy/host/serve.toml")
	}
	unit, _ := os.ReadFile(filepath.Join(dest, "usr/local/lib/systemd/system/hutch-serve.service"))
	if !strings.Contains(string(unit), "ExecStart=/usr/local/bin/hutch serve\n") || !strings.Contains(string(unit), "Type=notify\n") {
		t.Errorf("hutch-serve.service does not start the installed hutch with Type=notify:\n%s", unit)
	}
	run(t, repo, nil, "make", "--no-print-directory", "uninstall", "DESTDIR="+dest)
	if d := diff(before, snapshot(t, dest)); len(d) > 0 {
		t.Fatalf("uninstall left the DESTDIR changed:\n%s", strings.Join(d, "\n"))
	}

	// A config the operator changed stays, and so does its directory.
	run(t, repo, nil, "make", "--no-print-directory", "install", "DESTDIR="+dest)
	cfgPath := filepath.Join(dest, "etc/hutch/serve.toml")
	if err := os.WriteFile(cfgPath, []byte("listen = \"127.0.0.1:3001\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, repo, nil, "make", "--no-print-directory", "uninstall", "DESTDIR="+dest)
	after := snapshot(t, dest)
	d := diff(before, after)
	if len(d) != 2 || d[0] != "added etc/hutch drwxr-xr-x" || !strings.HasPrefix(d[1], "added etc/hutch/serve.toml ") {
		t.Fatalf("uninstall after the config changed: %q; want only the changed etc/hutch/serve.toml kept", d)
	}
}

func gunzip(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(z)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestUnitsVerify installs with a PREFIX of the test's own, so that the
// units name programs that exist, and runs systemd-analyze verify on
// them (which also checks that their man page opens).
func TestUnitsVerify(t *testing.T) {
	requireInstall(t)
	prefix := t.TempDir()
	run(t, repo, nil, "make", "--no-print-directory", "install", "PREFIX="+prefix, "SYSCONFDIR="+prefix+"/etc")
	units := []string{filepath.Join(prefix, "lib/systemd/system/hutch-serve.service"), filepath.Join(prefix, "lib/systemd/system/hutch-node.service")}
	cmd := exec.Command("systemd-analyze", append([]string{"verify"}, units...)...)
	cmd.Env = append(os.Environ(), "MANPATH="+filepath.Join(prefix, "share/man"))
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// deb is the package make deb-test built: $HUTCH_DEB.
func deb(t *testing.T) string {
	t.Helper()
	p := os.Getenv("HUTCH_DEB")
	if p == "" {
		t.Fatal("HUTCH_DEB names no package (make deb-test sets it)")
	}
	return p
}

// installedVersion is the Version of package file pkg.
func installedVersion(pkg string) string {
	out, err := exec.Command("dpkg-deb", "--field", pkg, "Version").Output()
	if err != nil {
		return "(dpkg-deb --field " + pkg + " Version: " + err.Error() + ")"
	}
	return strings.TrimSpace(string(out))
}

// TestDebLintian runs lintian on the package: no error.
func TestDebLintian(t *testing.T) {
	requireInstall(t)
	cmd := exec.Command("lintian", "--tag-display-limit", "0", deb(t))
	out, _ := cmd.CombinedOutput()
	var errs []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "E: ") {
			errs = append(errs, l)
		}
	}
	if len(errs) > 0 || cmd.ProcessState.ExitCode() > 1 {
		t.Fatalf("lintian found errors (exit %d):\n%s", cmd.ProcessState.ExitCode(), out)
	}
	t.Logf("lintian:\n%s", out)
}

// debianRoot unpacks the bookworm root filesystem (an OCI layout of one
// or more layers) into a new directory.
func debianRoot(t *testing.T) string {
	t.Helper()
	archive := filepath.Join(os.Getenv("HUTCH_BIN"), "images", "bookworm-rootfs.tar")
	oci := t.TempDir()
	run(t, "", nil, "tar", "-xf", archive, "-C", oci)
	var index struct{ Manifests []struct{ Digest string } }
	readJSON(t, filepath.Join(oci, "index.json"), &index)
	var manifest struct{ Layers []struct{ Digest string } }
	readJSON(t, blob(oci, index.Manifests[0].Digest), &manifest)
	root := t.TempDir()
	for _, l := range manifest.Layers {
		run(t, "", nil, "tar", "-xzf", blob(oci, l.Digest), "-C", root)
	}
	return root
}

func blob(oci, digest string) string {
	return filepath.Join(oci, "blobs", strings.Replace(digest, ":", "/", 1))
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(b, v)
	}
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestDebInstallPurge installs the package (and its dependencies) with
// apt-get into a clean Debian 12 root, runs hutch doctor and a sandbox
// from the installed paths there, purges it (and the dependencies apt
// brought), and checks that the root holds what it held before.
func TestDebInstallPurge(t *testing.T) {
	requireInstall(t)
	pkg := deb(t)
	root := debianRoot(t)
	// The root resolves names as this host does; apt's state, caches and
	// logs, and the API file systems, are apt's and the kernel's.
	run(t, "", nil, "cp", "/etc/resolv.conf", filepath.Join(root, "etc/resolv.conf"))
	skip := []string{"proc", "sys", "dev", "run", "tmp", "var/lib/apt", "var/cache", "var/log", "var/lib/dpkg", "etc/ld.so.cache", "var/lib/systemd/deb-systemd-helper-enabled", "var/lib/systemd/deb-systemd-helper-masked"}
	before := snapshot(t, root, skip...)
	run(t, "", nil, "cp", pkg, filepath.Join(root, "tmp", "hutch.deb"))
	// Without its recommends: those (openssh-client, mmdebstrap) pull in
	// packages that the root's own packages recommend in turn (git
	// recommends openssh-client, dpkg-dev gnupg and fakeroot), which
	// apt's autoremove then keeps for them after the purge.
	//
	// The root becomes the mount namespace's root (pivot_root), not a
	// chroot: runsc makes user namespaces, which the kernel refuses to a
	// chrooted process.
	script := `set -eu
R=$1
mount --rbind "$R" "$R"
for d in proc sys dev; do mount --rbind /$d "$R/$d"; mount --make-rslave "$R/$d"; done
mkdir -p "$R/tmp/.host"
cd "$R"
pivot_root . tmp/.host
cd /
/tmp/.host/usr/bin/umount -l /tmp/.host
inroot() { env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root DEBIAN_FRONTEND=noninteractive "$@"; }
inroot apt-get update -qq
inroot apt-get install -y -q --no-install-recommends /tmp/hutch.deb
echo "== dpkg -L"; inroot dpkg -L hutch
echo "== version"; inroot hutch version
echo "== doctor"; inroot hutch doctor
echo "== run"; inroot hutch run --rm --image busybox -- echo hello from the installed hutch
echo "== purge"
inroot apt-get purge -y -q hutch
inroot apt-get autoremove --purge -y -q
echo "== done"
`
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", root)
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("install, doctor, run, purge in a Debian 12 root: %v", err)
	}
	text := string(out)
	for _, want := range []string{"/usr/bin/hutch\n", "== version\nhutch " + installedVersion(pkg) + "\n", "/usr/lib/hutch/runsc\n", "/lib/systemd/system/hutch-serve.service\n", "/etc/hutch/serve.toml\n",
		"runsc version release-", "ok    sandbox", "hello from the installed hutch\n", "== done"} {
		if !strings.Contains(text, want) {
			t.Errorf("the output lacks %q", want)
		}
	}
	if strings.Contains(text, "FAIL ") {
		t.Errorf("hutch doctor failed a check")
	}
	if d := diff(before, snapshot(t, root, skip...)); len(d) > 0 {
		t.Fatalf("purge left the root changed:\n%s", strings.Join(d, "\n"))
	}
}
