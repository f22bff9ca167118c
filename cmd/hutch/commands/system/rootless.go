package system

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/engine"
)

// rootlessItem is one line of doctor's report for an unprivileged user:
// what works, or what is missing and the fix.
type rootlessItem struct {
	name   string
	ok     bool
	fatal  bool // sandboxes cannot run at all without it
	detail string
	fix    string
}

// rootlessReport checks what an unprivileged user needs: user namespaces
// (sandboxes run in one), user-mode networking (--net open/allow),
// cgroup delegation (--cpus, --memory), image builds (newuidmap and
// subordinate IDs) and the shared image store (the default image).
func rootlessReport(ctx context.Context, e *engine.Engine) []rootlessItem {
	return []rootlessItem{userns(), netstack(e), delegation(e), builds(e), sharedImages(ctx, e)}
}

func readSysctl(p string) (int, bool) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, false
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return n, err == nil
}

func userns() rootlessItem {
	it := rootlessItem{name: "userns", fatal: true}
	if n, ok := readSysctl("/proc/sys/kernel/unprivileged_userns_clone"); ok && n == 0 {
		it.detail = "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone=0)"
		it.fix = "as root: sysctl -w kernel.unprivileged_userns_clone=1 (and in /etc/sysctl.d/ to keep it)"
		return it
	}
	if n, ok := readSysctl("/proc/sys/user/max_user_namespaces"); ok && n == 0 {
		it.detail = "user namespaces are disabled (user.max_user_namespaces=0)"
		it.fix = "as root: sysctl -w user.max_user_namespaces=15000 (and in /etc/sysctl.d/ to keep it)"
		return it
	}
	if n, ok := readSysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"); ok && n == 1 {
		it.detail = "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1)"
		it.fix = "as root: an AppArmor profile allowing userns for runsc, or sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"
		return it
	}
	n, _ := readSysctl("/proc/sys/user/max_user_namespaces")
	it.ok, it.detail = true, fmt.Sprintf("unprivileged user namespaces allowed (max %d)", n)
	return it
}

// netstack checks what --net open and allow need without root:
// slirp4netns and the tools that build the namespaces, and a
// /dev/net/tun the user may open.
func netstack(e *engine.Engine) rootlessItem {
	it := rootlessItem{name: "netstack"}
	missing := e.RootlessNetworkMissing()
	if len(missing) == 0 {
		it.ok, it.detail = true, "--net open and allow through slirp4netns"
		return it
	}
	what, fixes := make([]string, len(missing)), make([]string, len(missing))
	for i, n := range missing {
		what[i], fixes[i] = n.What, n.Fix
	}
	it.detail = "--net open and allow unavailable (--net none only): " + strings.Join(what, "; ")
	it.fix = strings.Join(fixes, "; ")
	return it
}

func delegation(e *engine.Engine) rootlessItem {
	it := rootlessItem{name: "limits"}
	rep := e.Limits()
	enforced := "enforced: " + strings.Join(rep.Enforced, ", ")
	if rep.Delegated.Path != "" {
		enforced += " (cgroup " + rep.Delegated.Path + ")"
	}
	if len(rep.Unenforced) == 0 {
		it.ok, it.detail = true, enforced
		return it
	}
	it.detail = fmt.Sprintf("%s; NOT enforced: %s: %s", enforced, strings.Join(rep.Unenforced, ", "), rep.Why)
	it.fix = "a host with cgroup v2 and systemd: run hutch under `systemd-run --user --scope` (user@.service delegates cpu, memory and pids); asking for an unenforced limit explicitly is refused"
	return it
}

// builds reports whether this user can build images (hutch image build,
// and the default image on first use): in a user namespace of the user's
// subordinate IDs, mapped by newuidmap (docs/decisions/0027).
func builds(e *engine.Engine) rootlessItem {
	it := rootlessItem{name: "builds"}
	if err := e.BuilderCheck(); err != nil {
		it.detail = err.Error()
		it.fix = "as root: apt-get install uidmap; usermod --add-subuids 100000-165535 --add-subgids 100000-165535 USER"
		return it
	}
	it.ok, it.detail = true, "hutch image build and the default image in your own user namespace (RUN steps under gVisor)"
	return it
}

func sharedImages(ctx context.Context, e *engine.Engine) rootlessItem {
	it := rootlessItem{name: "images"}
	if _, err := e.Images().Get(ctx, engine.DefaultImage); err == nil {
		it.ok, it.detail = true, engine.DefaultImage+" is in your store"
		return it
	}
	dir := e.SharedImages()
	s, err := e.SharedStore()
	switch {
	case errdefs.IsNotFound(err):
		it.detail = "no shared image store, and " + engine.DefaultImage + " is not in your store: sandboxes without --image cannot start"
	case err != nil:
		it.detail = err.Error()
	default:
		if _, gerr := s.Get(ctx, engine.DefaultImage); gerr == nil {
			it.ok, it.detail = true, engine.DefaultImage+" in the shared store "+dir+" (copied into your store on first use)"
			return it
		}
		it.detail = "the shared store " + dir + " has no " + engine.DefaultImage
	}
	it.fix = "as root, once: hutch image share " + engine.DefaultImage + " (root builds it on first use); or import one: hutch image import base FILE.tar"
	return it
}
