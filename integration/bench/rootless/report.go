package main

import (
	"fmt"
	"strings"
	"time"
)

// render writes the report as the rootless section of the markdown file.
func render(r *report) string {
	var w strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&w, format, a...) }
	med := func(side, mode string, f func(*series) []float64) float64 {
		s := r.series[key(side, mode)]
		if s == nil {
			return 0
		}
		return summarize(f(s)).median
	}

	p("## Rootless: hutch as an unprivileged user, beside root and raw runsc\n\n")
	p("Produced by %s on %s, in %s; %s. Load average (1 min) at start %s, at end %s.\n\n",
		r.cfg.command, r.started.UTC().Format("2006-01-02 15:04 UTC"), r.elapsed.Round(time.Second), r.machine, r.loadStart, r.loadEnd)
	p("Three sides, the same binaries (copied to a directory every user can read), the busybox image: "+
		"**root** is hutch run by root; **rootless** is hutch run by the unprivileged user %s, created by the benchmark if missing, "+
		"with its state under its own `XDG_DATA_HOME`; **runsc** is raw runsc run by root, from a bundle holding the spec root's hutch wrote "+
		"for a `--net none` sandbox (hutch-init as init, its mounts and cgroup limits) and that sandbox's runsc flags "+
		"(`--net none` only: runsc alone has no network policy to compare). "+
		"Each of %d passes (after %d untimed) runs every side once per network mode, in an order that rotates from pass to pass, "+
		"so that the machine's load falls on all alike. In a pass each side runs `run --rm -- echo hi`, then `create`, "+
		"`exec ID -- echo hi`, %d × `exec ID -- true` and `rm -f ID`; runsc runs `runsc run` of `echo hi`, `runsc run --detach`, "+
		"`runsc exec ID echo hi`, %d × `runsc exec ID true` and `runsc delete --force ID`. Medians and p95 (nearest rank) over the passes; "+
		"`exec true` over every run (%d per side).\n\n",
		r.user, r.cfg.n, r.cfg.warm, r.cfg.execs, r.cfg.execs, r.cfg.n*r.cfg.execs)
	if r.tunChanged {
		p("`--net open` without root goes through slirp4netns, which needs `/dev/net/tun` usable by the user: "+
			"it was mode %04o here, and the benchmark set it to 0666 (udev's default on most machines) for the run and put %04o back at the end.\n\n",
			r.tunMode, r.tunMode)
	} else {
		p("`--net open` without root goes through slirp4netns, which needs `/dev/net/tun` usable by the user: it was already mode 0666 here.\n\n")
	}

	rows := []struct {
		label string
		f     func(*series) []float64
	}{
		{"create → first output (`create`, then `exec ID -- echo hi`; runsc: `run --detach`, then `exec`)", func(s *series) []float64 { return s.firstOut }},
		{"`create` alone (runsc: `run --detach`)", func(s *series) []float64 { return s.create }},
		{"`run --rm -- echo hi` → first output (runsc: `run`)", func(s *series) []float64 { return s.run }},
		{"exec `true` → exit", func(s *series) []float64 { return s.exec }},
		{"`rm -f` (runsc: `delete --force`)", func(s *series) []float64 { return s.rm }},
	}
	cell := func(side, mode string, f func(*series) []float64) (string, string) {
		s := r.series[key(side, mode)]
		if s == nil {
			return "—", "—"
		}
		st := summarize(f(s))
		return ms(st.median), ms(st.p95)
	}
	p("| network | measurement | root median | root p95 | rootless median | rootless p95 | rootless − root | runsc median | runsc p95 |\n")
	p("|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, mode := range modes {
		for _, row := range rows {
			rm, rp := cell("root", mode, row.f)
			lm, lp := cell("rootless", mode, row.f)
			wm, wp := cell("runsc", mode, row.f)
			p("| `--net %s` | %s | %s | %s | %s | %s | %s | %s | %s |\n", mode, row.label, rm, rp, lm, lp,
				signedMs(med("rootless", mode, row.f)-med("root", mode, row.f)), wm, wp)
		}
	}
	p("\n")

	p("### Inside `hutch create`, root and rootless\n\n")
	p("`hutch create --image busybox --net MODE` again, %d times per side and mode (sides in turn), with `--runsc SHIM` and a PATH whose first directory "+
		"holds shims for %s: each shim (this benchmark program) notes the time and what it runs, then execs the real command. "+
		"Each phase runs from one command's start to the next's (the last to hutch's exit), the commands in the order hutch started them "+
		"(by process ID; the calls of one process, such as nsenter that execs runsc, are one command, and a command whose shim noted its time "+
		"after a later command's counts from that time); the shims' own start-up is inside the phases. Medians:\n\n",
		r.cfg.phaseN, "`"+strings.Join(shimmed, "`, `")+"`")
	for _, mode := range modes {
		for _, side := range []string{"root", "rootless"} {
			ph := r.phases[key(side, mode)]
			if ph == nil {
				continue
			}
			p("| %s, `--net %s`: phase, from the start of | median |\n|---|---:|\n", side, mode)
			for i, n := range ph.names {
				p("| %s | %s |\n", n, ms(ph.median(i)))
			}
			p("| *before the first runsc call (or the nsenter that runs it)* | *%s* |\n", ms(ph.sum(0, ph.firstRunsc)))
			p("| *from the first runsc call to hutch's exit* | *%s* |\n", ms(ph.sum(ph.firstRunsc, len(ph.names))))
			if ph.odd > 0 {
				p("| (%d of %d runs made other calls and are left out) | |\n", ph.odd, r.cfg.phaseN)
			}
			p("\n")
		}
	}

	// Where rootless time differs.
	firstOut := func(s *series) []float64 { return s.firstOut }
	create := func(s *series) []float64 { return s.create }
	exec := func(s *series) []float64 { return s.exec }
	p("Where rootless time differs, from the numbers above: ")
	p("with `--net none`, create → first output takes %s rootless against %s as root (%s); ",
		ms(med("rootless", "none", firstOut)), ms(med("root", "none", firstOut)),
		signedMs(med("rootless", "none", firstOut)-med("root", "none", firstOut)))
	rn, ln := r.phases[key("root", "none")], r.phases[key("rootless", "none")]
	if rn != nil && ln != nil {
		p("inside `hutch create`, hutch's work before its first runsc call is %s rootless against %s as root, "+
			"and the runsc calls to hutch's exit %s against %s. ",
			ms(ln.sum(0, ln.firstRunsc)), ms(rn.sum(0, rn.firstRunsc)),
			ms(ln.sum(ln.firstRunsc, len(ln.names))), ms(rn.sum(rn.firstRunsc, len(rn.names))))
	}
	p("`hutch create` with `--net open` against `--net none`: rootless %s (%s against %s), root %s (%s against %s). ",
		signedMs(med("rootless", "open", create)-med("rootless", "none", create)),
		ms(med("rootless", "open", create)), ms(med("rootless", "none", create)),
		signedMs(med("root", "open", create)-med("root", "none", create)),
		ms(med("root", "open", create)), ms(med("root", "none", create)))
	if lo := r.phases[key("rootless", "open")]; lo != nil {
		p("Rootless with `--net open`, hutch makes the network before its first runsc call (%s in all before it; root's, %s)",
			ms(lo.sum(0, lo.firstRunsc)), ms(phaseSum(r.phases[key("root", "open")], true)))
		var parts []string
		if i := lo.find("sleep infinity"); i >= 0 {
			parts = append(parts, fmt.Sprintf("hutch's own work until it starts the process holding the new user, network and mount namespaces, %s", ms(lo.sum(0, i))))
		}
		if i, j := lo.find("sleep infinity"), lo.find("slirp4netns"); i >= 0 && j > i {
			parts = append(parts, fmt.Sprintf("from there to slirp4netns's start (the sandbox's network namespace, its firewall and link), %s", ms(lo.sum(i, j))))
		}
		if j := lo.find("slirp4netns"); j >= 0 {
			parts = append(parts, fmt.Sprintf("slirp4netns, from its start to the next command (hutch waits for its ready signal), %s", ms(lo.median(j))))
			if k := lo.firstRunsc; k > j+1 {
				parts = append(parts, fmt.Sprintf("then the DNS resolver and the rest up to runsc, %s", ms(lo.sum(j+1, k))))
			}
		}
		if len(parts) > 0 {
			p(": %s", strings.Join(parts, "; "))
		}
		p(". ")
	}
	p("Exec `true` into a running sandbox differs by %s rootless against root with `--net none`, and by %s with `--net open`.\n",
		signedMs(med("rootless", "none", exec)-med("root", "none", exec)),
		signedMs(med("rootless", "open", exec)-med("root", "open", exec)))
	return w.String()
}

// phaseSum is the sum of the medians before the first runsc call (before)
// or from it on.
func phaseSum(ph *phases, before bool) float64 {
	if ph == nil {
		return 0
	}
	if before {
		return ph.sum(0, ph.firstRunsc)
	}
	return ph.sum(ph.firstRunsc, len(ph.names))
}
