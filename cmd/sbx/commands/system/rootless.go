package system

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"

	"sbx.dev/sbx/engine"
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
// (sandboxes run in one), a user-mode network stack (--net open/allow),
// cgroup delegation (--cpus, --memory), subordinate IDs (rootless builds
// of the default image) and the shared image store (the default image).
func rootlessReport(ctx context.Context, e *engine.Engine) []rootlessItem {
	return []rootlessItem{userns(), netstack(), delegation(e), subIDs(), sharedImages(ctx, e)}
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

func netstack() rootlessItem {
	it := rootlessItem{name: "netstack"}
	var found []string
	for _, b := range []string{"pasta", "passt", "slirp4netns"} {
		if p, err := exec.LookPath(b); err == nil {
			found = append(found, p)
		}
	}
	if len(found) == 0 {
		it.detail = "no user-mode network stack (pasta/passt or slirp4netns): rootless sandboxes get --net none only"
		it.fix = "as root: apt-get install passt (or slirp4netns)"
		return it
	}
	it.ok, it.detail = true, "user-mode networking: "+strings.Join(found, ", ")
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
	it.fix = "a host with cgroup v2 and systemd: run sbx under `systemd-run --user --scope` (user@.service delegates cpu, memory and pids); asking for an unenforced limit explicitly is refused"
	return it
}

// subIDs checks /etc/subuid and /etc/subgid for the user: what
// mmdebstrap's unshare mode maps to build an image without root.
func subIDs() rootlessItem {
	it := rootlessItem{name: "subids"}
	u, err := user.Current()
	if err != nil {
		it.detail = err.Error()
		return it
	}
	var missing []string
	for _, f := range []string{"/etc/subuid", "/etc/subgid"} {
		if !hasSubIDs(f, u.Username, u.Uid) {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		it.detail = "no subordinate IDs for " + u.Username + " in " + strings.Join(missing, " and ") + " (only rootless image builds with mmdebstrap --mode=unshare need them; sbx's sandboxes do not)"
		it.fix = "as root: usermod --add-subuids 100000-165535 --add-subgids 100000-165535 " + u.Username
		return it
	}
	it.ok, it.detail = true, "subordinate IDs for "+u.Username+" in /etc/subuid and /etc/subgid"
	return it
}

func hasSubIDs(path, name, uid string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	return scanSubIDs(f, name, uid)
}

func scanSubIDs(r io.Reader, name, uid string) bool {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Split(strings.TrimSpace(sc.Text()), ":")
		if len(fields) == 3 && (fields[0] == name || fields[0] == uid) {
			if n, err := strconv.Atoi(fields[2]); err == nil && n > 0 {
				return true
			}
		}
	}
	return false
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
	it.fix = "as root, once: sbx image share " + engine.DefaultImage + " (root builds it on first use); or import one: sbx image import base FILE.tar"
	return it
}
