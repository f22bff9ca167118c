package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/integration/bench/benchcmd"
	"hutch.dev/hutch/integration/bench/benchexit"
)

// rawSandbox is one raw runsc container run with hutch's spec and runsc
// flags, without hutch's network namespace and init, in a cgroup of its own.
type rawSandbox struct {
	id, cgroup, bundle string
	args               []string // runsc's global flags
}

func (r rawSandbox) runsc(args ...string) *exec.Cmd {
	return exec.Command(filepath.Join(bin, "runsc"), append(append([]string(nil), r.args...), args...)...)
}

// remove deletes the container and its cgroup; it is safe on one that is
// already gone.
func (r rawSandbox) remove() {
	r.runsc("delete", "--force", r.id).Run() //nolint:errcheck // best effort
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + r.cgroup)
	more, _ := filepath.Glob("/sys/fs/cgroup" + r.cgroup)
	for _, d := range append(dirs, more...) {
		os.Remove(d)
	}
}

// newRaw derives a raw runsc container named name that runs argv from hutch
// sandbox id: its runsc global flags (with the root, overlay directory and
// network replaced) and its bundle's spec.
func newRaw(id, rawRoot, name string, argv ...string) rawSandbox {
	globals, err := benchcmd.RunscGlobals(root, id)
	if err != nil {
		benchexit.Fatal(err)
	}
	dir := filepath.Join(top, name)
	overlay := filepath.Join(dir, "overlay")
	if err := os.MkdirAll(overlay, 0o700); err != nil {
		benchexit.Fatal(err)
	}
	var raw []string
	for _, g := range globals {
		switch {
		case strings.HasPrefix(g, "--root="):
			raw = append(raw, "--root="+rawRoot)
		case strings.HasPrefix(g, "--overlay2="):
			raw = append(raw, "--overlay2=root:dir="+overlay)
		case strings.HasPrefix(g, "--network="):
			raw = append(raw, "--network=none")
		default:
			raw = append(raw, g)
		}
	}
	b, err := os.ReadFile(filepath.Join(root, "sandboxes", id, "bundle", "config.json"))
	if err != nil {
		benchexit.Fatal(err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		benchexit.Fatal(err)
	}
	var mounts []specs.Mount
	for _, m := range spec.Mounts {
		if m.Destination != "/.hutch/hutch-init" {
			mounts = append(mounts, m)
		}
	}
	spec.Mounts = mounts
	spec.Annotations = nil
	r := rawSandbox{id: "hutch-bench-density-" + name, cgroup: "/hutch-bench-density-" + name, bundle: filepath.Join(dir, "bundle"), args: raw}
	spec.Linux.CgroupsPath = r.cgroup
	rootfs := *spec.Root
	rootfs.Readonly = false
	spec.Root = &rootfs
	for i, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			spec.Linux.Namespaces[i].Path = ""
		}
	}
	spec.Process.Terminal = false
	spec.Process.Args = argv
	if err := os.MkdirAll(r.bundle, 0o700); err != nil {
		benchexit.Fatal(err)
	}
	sb, _ := json.Marshal(&spec)
	if err := os.WriteFile(filepath.Join(r.bundle, "config.json"), sb, 0o600); err != nil {
		benchexit.Fatal(err)
	}
	return r
}

// unmountRaw undoes what raw runsc mounted under rawRoot.
func unmountRaw(rawRoot string) {
	for syscall.Unmount(filepath.Join(rawRoot, "null-netns"), syscall.MNT_DETACH) == nil {
	}
}
