package shim

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestResolvePolicy(t *testing.T) {
	const gib = 1 << 30
	open := Config{Network: "open", Allow: []string{"10.1.0.0/16", "*.example.com:443", "pypi.org"}, DNS: []string{"1.1.1.1", "9.9.9.9"},
		Disk: "4g", CPUs: 4, Memory: "8g", Pids: 2048}
	allow := Config{Network: "allow", Allow: []string{"10.1.0.0/16:5432", "*.example.com", "1.2.3.4"}}
	type want struct {
		network string
		allow   int
		dns     int
		disk    int64
		mem     int64
		cpus    float64
		pids    int64
	}
	hutchDefaults := want{network: "none", disk: 10 * gib, mem: 2 * gib, cpus: 2, pids: 1024}
	with := func(w want, f func(*want)) want { f(&w); return w }
	for _, tc := range []struct {
		name     string
		cfg      Config
		ann      map[string]string
		hasNetns bool
		want     want
		// err is part of the error; denied says it is a ceiling refusal
		// (errdefs.ErrPermissionDenied), else an invalid argument.
		err    string
		denied bool
	}{
		// No annotations: the operator's config, else hutch's defaults.
		{name: "hutch defaults", want: hutchDefaults},
		{name: "operator defaults", cfg: open, want: want{network: "open", allow: 3, dns: 2, disk: 4 * gib, mem: 8 * gib, cpus: 4, pids: 2048}},
		{name: "pod network kept", hasNetns: true, want: with(hutchDefaults, func(w *want) { w.network = "" })},

		// Network: none < allow < open; the pod's own namespace only
		// tightens to none.
		{name: "open to none", cfg: open, ann: map[string]string{AnnotationNetwork: "none"}, want: want{network: "none", dns: 2, disk: 4 * gib, mem: 8 * gib, cpus: 4, pids: 2048}},
		{name: "open to allow", cfg: open, ann: map[string]string{AnnotationNetwork: "allow", AnnotationAllow: "pypi.org"}, want: want{network: "allow", allow: 1, dns: 2, disk: 4 * gib, mem: 8 * gib, cpus: 4, pids: 2048}},
		{name: "allow to none", cfg: allow, ann: map[string]string{AnnotationNetwork: "none"}, want: hutchDefaults},
		{name: "pod network to none", hasNetns: true, ann: map[string]string{AnnotationNetwork: "none"}, want: hutchDefaults},
		{name: "none to open", ann: map[string]string{AnnotationNetwork: "open"}, err: `annotation dev.hutch.network="open" exceeds the operator's ceiling network "none"`, denied: true},
		{name: "none to allow", ann: map[string]string{AnnotationNetwork: "allow", AnnotationAllow: "pypi.org"}, err: `annotation dev.hutch.network="allow" exceeds the operator's ceiling network "none"`, denied: true},
		{name: "allow to open", cfg: allow, ann: map[string]string{AnnotationNetwork: "open"}, err: `annotation dev.hutch.network="open" exceeds the operator's ceiling network "allow"`, denied: true},
		{name: "pod network to open", hasNetns: true, ann: map[string]string{AnnotationNetwork: "open"}, err: `annotation dev.hutch.network="open" exceeds the operator's ceiling: pods keep their own network namespace`, denied: true},
		{name: "pod network to allow", hasNetns: true, ann: map[string]string{AnnotationNetwork: "allow", AnnotationAllow: "pypi.org"}, err: "only \"none\" tightens it", denied: true},
		{name: "bad mode", ann: map[string]string{AnnotationNetwork: "sideways"}, err: `--net "sideways": want one of none, open, allow`},

		// Allow rules: within the operator's list; under open, also
		// public addresses open reaches anyway.
		{name: "allow subset", cfg: allow, ann: map[string]string{AnnotationAllow: "10.1.2.0/24:5432, api.example.com, *.eu.example.com, 1.2.3.4"}, want: with(hutchDefaults, func(w *want) { w.network, w.allow = "allow", 4 })},
		{name: "allow wider prefix", cfg: allow, ann: map[string]string{AnnotationAllow: "10.0.0.0/8:5432"}, err: "rule 10.0.0.0/8:5432 is not within the operator's network \"allow\" allow list [10.1.0.0/16:5432, *.example.com, 1.2.3.4]", denied: true},
		{name: "allow other port", cfg: allow, ann: map[string]string{AnnotationAllow: "10.1.2.3:22"}, err: "rule 10.1.2.3/32:22 is not within", denied: true},
		{name: "allow any port of a port rule", cfg: allow, ann: map[string]string{AnnotationAllow: "10.1.2.3"}, err: "rule 10.1.2.3/32 is not within", denied: true},
		{name: "allow wildcard's base", cfg: allow, ann: map[string]string{AnnotationAllow: "example.com"}, err: "rule example.com is not within", denied: true},
		{name: "allow other domain", cfg: allow, ann: map[string]string{AnnotationAllow: "evil.org"}, err: "rule evil.org is not within", denied: true},
		{name: "allow everything", cfg: allow, ann: map[string]string{AnnotationAllow: "0.0.0.0/0"}, err: "rule 0.0.0.0/0 is not within", denied: true},
		{name: "open: public address", cfg: open, ann: map[string]string{AnnotationNetwork: "allow", AnnotationAllow: "8.8.8.8:53"}, want: want{network: "allow", allow: 1, dns: 2, disk: 4 * gib, mem: 8 * gib, cpus: 4, pids: 2048}},
		{name: "open: operator's private range", cfg: open, ann: map[string]string{AnnotationAllow: "10.1.9.9"}, want: want{network: "open", allow: 1, dns: 2, disk: 4 * gib, mem: 8 * gib, cpus: 4, pids: 2048}},
		{name: "open: metadata", cfg: open, ann: map[string]string{AnnotationAllow: "169.254.169.254"}, err: "rule 169.254.169.254/32 is not within the operator's network \"open\" allow list", denied: true},
		{name: "open: every address", cfg: open, ann: map[string]string{AnnotationAllow: "0.0.0.0/0"}, err: "rule 0.0.0.0/0 is not within", denied: true},
		{name: "open: unlisted domain", cfg: open, ann: map[string]string{AnnotationNetwork: "allow", AnnotationAllow: "evil.org"}, err: "rule evil.org is not within", denied: true},
		{name: "allow without network", ann: map[string]string{AnnotationAllow: "example.com"}, err: "--allow needs --net open or allow"},
		{name: "bad rule", cfg: allow, ann: map[string]string{AnnotationAllow: "no_dots"}, err: `--allow "no_dots"`},

		// DNS: only servers the operator lists.
		{name: "dns subset", cfg: open, ann: map[string]string{AnnotationDNS: "9.9.9.9"}, want: want{network: "open", allow: 3, dns: 1, disk: 4 * gib, mem: 8 * gib, cpus: 4, pids: 2048}},
		{name: "dns unlisted", cfg: open, ann: map[string]string{AnnotationDNS: "9.9.9.9,10.0.0.53"}, err: `annotation dev.hutch.dns="9.9.9.9,10.0.0.53" exceeds the operator's ceiling: server 10.0.0.53 is not one the operator lists [1.1.1.1, 9.9.9.9]`, denied: true},
		{name: "dns none listed", cfg: Config{Network: "open"}, ann: map[string]string{AnnotationDNS: "1.1.1.1"}, err: "server 1.1.1.1 is not one the operator lists []", denied: true},

		// Limits: no higher than the operator's (or hutch's default).
		{name: "disk lower", ann: map[string]string{AnnotationDisk: "512m"}, want: with(hutchDefaults, func(w *want) { w.disk = 512 << 20 })},
		{name: "disk higher", ann: map[string]string{AnnotationDisk: "100t"}, err: `annotation dev.hutch.disk="100t" exceeds the operator's ceiling 10GiB`, denied: true},
		{name: "disk above the operator's", cfg: open, ann: map[string]string{AnnotationDisk: "5g"}, err: "exceeds the operator's ceiling 4GiB", denied: true},
		{name: "memory lower", cfg: open, ann: map[string]string{AnnotationMemory: "1g"}, want: want{network: "open", allow: 3, dns: 2, disk: 4 * gib, mem: gib, cpus: 4, pids: 2048}},
		{name: "memory higher", ann: map[string]string{AnnotationMemory: "3g"}, err: `annotation dev.hutch.memory="3g" exceeds the operator's ceiling 2GiB`, denied: true},
		{name: "cpus lower", ann: map[string]string{AnnotationCPUs: "0.5"}, want: with(hutchDefaults, func(w *want) { w.cpus = 0.5 })},
		{name: "cpus higher", cfg: open, ann: map[string]string{AnnotationCPUs: "4.5"}, err: `annotation dev.hutch.cpus="4.5" exceeds the operator's ceiling of 4 CPUs`, denied: true},
		{name: "pids lower", ann: map[string]string{AnnotationPids: "64"}, want: with(hutchDefaults, func(w *want) { w.pids = 64 })},
		{name: "pids higher", ann: map[string]string{AnnotationPids: "1025"}, err: `annotation dev.hutch.pids="1025" exceeds the operator's ceiling of 1024 processes`, denied: true},
		{name: "bad disk", ann: map[string]string{AnnotationDisk: "lots"}, err: `size "lots"`},
		{name: "tiny disk", ann: map[string]string{AnnotationDisk: "1k"}, err: "--disk 1KiB below the minimum"},
		{name: "tiny memory", ann: map[string]string{AnnotationMemory: "1m"}, err: "--memory 1MiB below the minimum"},
		{name: "bad cpus", ann: map[string]string{AnnotationCPUs: "many"}, err: `--cpus "many": want a number above 0`},
		{name: "zero cpus", ann: map[string]string{AnnotationCPUs: "0"}, err: `--cpus "0": want a number above 0`},
		{name: "zero memory", ann: map[string]string{AnnotationMemory: "0"}, err: `size "0": want more than 0`},
		{name: "bad pids", ann: map[string]string{AnnotationPids: "1.5"}, err: `--pids "1.5": want a whole number above 0`},
		{name: "too few pids", ann: map[string]string{AnnotationPids: "2"}, err: "--pids 2 out of range"},

		// The operator's config itself is validated.
		{name: "bad config", cfg: Config{Network: "sideways"}, err: `runtime config: invalid argument: --net "sideways"`},
		{name: "bad config disk", cfg: Config{Disk: "lots"}, err: `runtime config: disk: invalid argument: size "lots"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := resolvePolicy(tc.cfg, &specs.Spec{Annotations: tc.ann}, tc.hasNetns)
			if tc.err != "" {
				var kind error = errdefs.ErrInvalidArgument
				if tc.denied {
					kind = errdefs.ErrPermissionDenied
				}
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, kind) {
					t.Fatalf("want a %v error with %q, got %v", kind, tc.err, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := want{network: p.Network, allow: len(p.Allow), dns: len(p.DNS), disk: p.Disk, mem: p.Memory, cpus: p.CPUs, pids: p.Pids}
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			if len(p.AllowRaw) != len(p.Allow) {
				t.Fatalf("rules as written %v do not match the parsed %v", p.AllowRaw, p.Allow)
			}
		})
	}
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.toml")
	if err := os.WriteFile(good, []byte("runsc = \"/opt/runsc\"\nnetwork = \"open\"\nallow = [\"example.com\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	typo := filepath.Join(dir, "typo.toml")
	if err := os.WriteFile(typo, []byte("netwrok = \"open\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := func(o *runtimeoptions.Options) *runtimeoptions.Options { return o }
	for _, tc := range []struct {
		name string
		o    *runtimeoptions.Options
		want Config
		err  string
	}{
		{name: "file", o: opts(&runtimeoptions.Options{ConfigPath: good}), want: Config{Runsc: "/opt/runsc", Network: "open", Allow: []string{"example.com"}}},
		{name: "inline body with containerd's keys", o: opts(&runtimeoptions.Options{ConfigBody: []byte("ConfigPath = \"\"\nnetwork = \"allow\"\n")}), want: Config{Network: "allow"}},
		{name: "unknown key in a file", o: opts(&runtimeoptions.Options{ConfigPath: typo}), err: "netwrok"},
		{name: "missing file", o: opts(&runtimeoptions.Options{ConfigPath: filepath.Join(dir, "nope.toml")}), err: "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := typeurl.MarshalAnyToProto(tc.o)
			if err != nil {
				t.Fatal(err)
			}
			c, err := loadConfig(a)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("want an error with %q, got %v", tc.err, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.want.Runsc != "" && c.Runsc != tc.want.Runsc || c.Network != tc.want.Network || strings.Join(c.Allow, ",") != strings.Join(tc.want.Allow, ",") {
				t.Fatalf("got %+v", c)
			}
			if c.RunscRoot != "/run/hutch/containerd" || c.Runsc == "" {
				t.Fatalf("defaults not filled in: %+v", c)
			}
		})
	}
}

func TestPodCgroupParent(t *testing.T) {
	for _, tc := range []struct{ typ, path, want string }{
		{criTypeSandbox, "/kubepods/burstable/pod123/abc", "/kubepods/burstable/pod123"},
		{criTypeSandbox, "/k8s.io/abc", ""},
		{criTypeSandbox, "kubepods-pod123.slice:cri:abc", ""},
		{criTypeContainer, "/kubepods/pod123/abc", ""},
	} {
		s := &specs.Spec{Annotations: map[string]string{criContainerType: tc.typ}, Linux: &specs.Linux{CgroupsPath: tc.path}}
		if got := podCgroupParent(s); got != tc.want {
			t.Errorf("%s %s: got %q, want %q", tc.typ, tc.path, got, tc.want)
		}
	}
}

// A sandbox on the host's network (no network namespace in its spec) is
// refused, naming why and the way out; naming hutch's network, or having a
// namespace of its own, it runs.
func TestCheckHostNetwork(t *testing.T) {
	hostNet := &specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}}}}
	err := checkHostNetwork(hostNet)
	if !errors.Is(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "host's network") || !strings.Contains(err.Error(), AnnotationNetwork) {
		t.Errorf("host network: got %v, want permission denied naming the host's network and %s", err, AnnotationNetwork)
	}
	if err := checkHostNetwork(&specs.Spec{}); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("no namespaces at all: got %v, want permission denied", err)
	}
	named := &specs.Spec{Linux: hostNet.Linux, Annotations: map[string]string{AnnotationNetwork: "none"}}
	if err := checkHostNetwork(named); err != nil {
		t.Errorf("host network with %s: %v", AnnotationNetwork, err)
	}
	for _, path := range []string{"", "/var/run/netns/cni-1"} {
		s := &specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.NetworkNamespace, Path: path}}}}
		if err := checkHostNetwork(s); err != nil {
			t.Errorf("network namespace %q: %v", path, err)
		}
	}
}

// The operator's allow_suid reaches the pod's runsc flags; a pod on the
// host's network is refused before anything is set up.
func TestNewPodAllowSUID(t *testing.T) {
	ctx := namespaces.WithNamespace(context.Background(), "test")
	spec := func() *specs.Spec {
		return &specs.Spec{Annotations: map[string]string{AnnotationNetwork: "none"},
			Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.NetworkNamespace}}}}
	}
	for _, allow := range []bool{false, true} {
		root := t.TempDir()
		p, err := newPod(ctx, "test", "pod1", Config{Runsc: "runsc", RunscRoot: root, AllowSUID: allow}, spec())
		if err != nil {
			t.Fatal(err)
		}
		if p.r.AllowSUID != allow {
			t.Errorf("allow_suid %v: runsc AllowSUID %v", allow, p.r.AllowSUID)
		}
		if err := p.teardown(ctx); err != nil {
			t.Fatal(err)
		}
	}
	root := t.TempDir()
	host := &specs.Spec{Linux: &specs.Linux{}}
	if _, err := newPod(ctx, "test", "pod2", Config{Runsc: "runsc", RunscRoot: root}, host); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("host network pod: got %v, want permission denied", err)
	}
	if _, err := os.Stat(filepath.Join(root, "test", "hutch", "pod2")); !os.IsNotExist(err) {
		t.Errorf("a refused pod left its state directory: %v", err)
	}
}
