package integration

import (
	"regexp"
	"strings"
	"testing"
)

// baseToolsScript uses the base image's tools the way an agent would, with
// no network: a Python wheel and an npm tarball made on the spot are
// installed from local files.
const baseToolsScript = `set -e
id -un; pwd
python3 -c 'import sys; print("python", sys.version_info[0])'
node -e 'console.log("node", 6 * 7)'
git init -q ~/repo && cd ~/repo && echo hi > f && git add f
git -c user.name=hutch -c user.email=hutch@localhost commit -q -m first && echo "commits $(git rev-list --count HEAD)"

mkdir -p ~/w/hello_hutch && cd ~/w
printf '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n[project]\nname = "hello-hutch"\nversion = "1.0"\n' > pyproject.toml
echo 'def hi(): return "hi from wheel"' > hello_hutch/__init__.py
python3 -m pip wheel -q --no-build-isolation --no-deps --no-index -w dist .
python3 -m venv ~/venv
~/venv/bin/pip install -q --no-index dist/hello_hutch-1.0-py3-none-any.whl
~/venv/bin/python -c 'import hello_hutch; print(hello_hutch.hi())'
python3 -m pip install -q --no-index dist/hello_hutch-1.0-py3-none-any.whl
cd / && python3 -c 'import hello_hutch, site; print(hello_hutch.__file__.startswith(site.getusersitepackages()))'

mkdir -p ~/n/lib ~/n/app && cd ~/n/lib
echo '{"name":"hello-hutch","version":"1.0.0","main":"index.js"}' > package.json
echo 'module.exports = () => "hi from tarball";' > index.js
npm pack --silent >/dev/null
cd ~/n/app && echo '{"name":"app","version":"1.0.0"}' > package.json
npm install --offline --no-audit --no-fund --silent ../lib/hello-hutch-1.0.0.tgz
node -e 'console.log(require("hello-hutch")())'
`

// loginShellCompare prints, for user $1, what a login shell is (its
// environment, options and umask) with the image's /etc/profile, then the
// same with Debian's own, which it puts back in place for the while.
const loginShellCompare = `set -e
state() { su -s /bin/bash -c 'bash -l -c "env; shopt; set -o; echo umask \$(umask)" | grep -v "^_=" | sort' "$1"; }
state "$1"
echo "--- with Debian's /etc/profile"
cp /etc/profile /tmp/profile.ours
cp /usr/share/base-files/profile /etc/profile
state "$1" || true
cp /tmp/profile.ours /etc/profile
`

// On a fresh root the first sandbox without --image builds the default
// image, saying so, and later ones reuse it. It runs what agents need:
// python3, node, git, pip (in a venv and outside one) and npm installs
// from local files, as the non-root user "user". It records its package
// versions, its build step ran under gVisor, and building buildimg/base
// again gives the same image.
func TestBaseImage(t *testing.T) {
	e := newEnv(t)
	r := e.run(nil, "run", "--rm", "--", "python3", "-c", "print(6*7)")
	if r.code != 0 || r.stdout != "42\n" {
		t.Fatalf("first run on the default image: %s", r)
	}
	for _, want := range []string{"base:latest is not built yet; building it now", "RUN useradd", "hutch: built base:latest"} {
		if !strings.Contains(r.stderr, want) {
			t.Fatalf("first run should say it builds the default image, with progress (%q):\n%s", want, r.stderr)
		}
	}
	r = e.run(nil, "run", "--rm", "--", "true")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("second run should reuse the image silently: %s", r)
	}

	id := e.create("--image", "base")
	out := e.ok("exec", id, "--", "bash", "-c", baseToolsScript)
	want := "user\n/home/user\npython 3\nnode 42\ncommits 1\nhi from wheel\nTrue\nhi from tarball\n"
	if out != want {
		t.Fatalf("tools on base:\n got %q\nwant %q", out, want)
	}
	pkgs := e.ok("exec", id, "--", "cat", "/usr/share/hutch/packages.tsv")
	for _, p := range []string{"python3\t", "nodejs\t", "npm\t", "git\t", "curl\t", "build-essential\t", "procps\t"} {
		if !strings.Contains(pkgs, "\n"+p) {
			t.Fatalf("package manifest lacks %q", p)
		}
	}
	if info := e.ok("exec", id, "--", "cat", "/usr/share/hutch/build-info"); !strings.Contains(info, "gvisor") {
		t.Fatalf("base's RUN step did not run under gVisor: %q", info)
	}
	if out := e.ok("exec", id, "--", "gcc", "--version"); !strings.Contains(out, "gcc") {
		t.Fatalf("build-essential: %q", out)
	}
	// E2B's SDK runs every command in a login shell. It starts no process
	// of its own (Debian's /etc/profile ran id(1)), and it is the shell
	// Debian's own /etc/profile gives, for the user and for root.
	if trace := e.run(nil, "exec", id, "--", "bash", "-l", "-x", "-c", "true"); trace.code != 0 || strings.Contains(trace.stderr, "id -u") {
		t.Fatalf("a login shell runs id(1) at startup:\n%s", trace)
	}
	for _, user := range []string{"user", "root"} {
		out := e.ok("exec", "--user", "root", id, "--", "bash", "-c", loginShellCompare, "compare", user)
		ours, debians, ok := strings.Cut(out, "--- with Debian's /etc/profile\n")
		if !ok || ours != debians || !regexp.MustCompile(`(?m)^login_shell\s+on$`).MatchString(ours) {
			t.Fatalf("a login shell as %s differs from Debian's:\n%s", user, out)
		}
	}
	e.ok("rm", "-f", id)
	e.assertClean(id)

	base := e.images()["base:latest"]
	if base.Config.Config.Labels["dev.hutch.packages"] != "/usr/share/hutch/packages.tsv" {
		t.Fatalf("base should name its package manifest in a label: %+v", base.Config.Config.Labels)
	}
	// The readable Dockerfile is the one hutch builds: same input, same image.
	again := strings.TrimSpace(e.ok("image", "build", "--progress", "quiet", "-t", "base-again", "../buildimg/base"))
	if again != base.Digest {
		t.Fatalf("buildimg/base built again gives %s, the default image is %s", again, base.Digest)
	}
}
