package shim

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestResolvePolicy(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      Config
		ann      map[string]string
		hasNetns bool
		network  string
		disk     int64
		allow    int
		err      string
	}{
		{name: "defaults", network: "none", disk: 10 << 30},
		{name: "open", ann: map[string]string{AnnotationNetwork: "open"}, network: "open", disk: 10 << 30},
		{name: "allow rules", ann: map[string]string{AnnotationNetwork: "allow", AnnotationAllow: "example.com:443, 10.1.0.0/16"}, network: "allow", allow: 2, disk: 10 << 30},
		{name: "disk", ann: map[string]string{AnnotationDisk: "512m"}, network: "none", disk: 512 << 20},
		{name: "config defaults", cfg: Config{Network: "open", Disk: "1g"}, network: "open", disk: 1 << 30},
		{name: "annotation over config", cfg: Config{Network: "open"}, ann: map[string]string{AnnotationNetwork: "none"}, network: "none", disk: 10 << 30},
		{name: "pod network kept", hasNetns: true, network: "", disk: 10 << 30},
		{name: "pod network replaced", hasNetns: true, ann: map[string]string{AnnotationNetwork: "none"}, network: "none", disk: 10 << 30},
		{name: "bad mode", ann: map[string]string{AnnotationNetwork: "sideways"}, err: `--net "sideways": want one of none, open, allow`},
		{name: "allow without network", ann: map[string]string{AnnotationAllow: "example.com"}, err: "--allow needs --net open or allow"},
		{name: "bad rule", ann: map[string]string{AnnotationNetwork: "allow", AnnotationAllow: "no_dots"}, err: `--allow "no_dots"`},
		{name: "bad disk", ann: map[string]string{AnnotationDisk: "lots"}, err: `size "lots"`},
		{name: "tiny disk", ann: map[string]string{AnnotationDisk: "1k"}, err: "--disk 1KiB below the minimum"},
		{name: "bad dns", ann: map[string]string{AnnotationNetwork: "open", AnnotationDNS: "resolver"}, err: `--dns "resolver"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := resolvePolicy(tc.cfg, &specs.Spec{Annotations: tc.ann}, tc.hasNetns)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("want an invalid-argument error with %q, got %v", tc.err, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Network != tc.network || p.Disk != tc.disk || len(p.Allow) != tc.allow {
				t.Fatalf("got network %q disk %d allow %v", p.Network, p.Disk, p.Allow)
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
			if c.RunscRoot != "/run/sbx/containerd" || c.Runsc == "" {
				t.Fatalf("defaults not filled in: %+v", c)
			}
		})
	}
}

func TestSetPodCgroup(t *testing.T) {
	for _, tc := range []struct{ typ, path, want string }{
		{criTypeSandbox, "/kubepods/burstable/pod123/abc", "/kubepods/burstable/pod123"},
		{criTypeSandbox, "/k8s.io/abc", ""},
		{criTypeContainer, "/kubepods/pod123/abc", ""},
	} {
		s := &specs.Spec{Annotations: map[string]string{criContainerType: tc.typ}, Linux: &specs.Linux{CgroupsPath: tc.path}}
		setPodCgroup(s)
		if got := s.Annotations[cgroupParentAnnotation]; got != tc.want {
			t.Errorf("%s %s: got %q, want %q", tc.typ, tc.path, got, tc.want)
		}
	}
}
