package assembly

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// containerd's defaults for a container that is not privileged.
var (
	defaultMasked = []string{"/proc/asound", "/proc/acpi", "/proc/interrupts", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
		"/sys/firmware", "/sys/devices/virtual/powercap", "/proc/scsi"}
	defaultReadonly = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

func baseMounts() []specs.Mount {
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
	}
}

func TestMaskedPaths(t *testing.T) {
	for _, tc := range []struct {
		name             string
		masked, readonly []string
		mounts           []specs.Mount
		want             []specs.Mount
	}{
		{
			name: "containerd defaults", masked: defaultMasked, readonly: defaultReadonly, mounts: baseMounts(),
			want: []specs.Mount{
				{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
				baseMounts()[1],
				{Destination: "/sys/firmware", Type: "tmpfs", Source: "tmpfs", Options: []string{"ro", "nosuid", "nodev", "noexec"}},
			},
		},
		{
			name: "a masked file", masked: []string{"/proc/cgroups", "/proc/nosuch/deeper"}, mounts: baseMounts(),
			want: append(baseMounts(), specs.Mount{Destination: "/proc/cgroups", Type: "bind", Source: "/run/empty",
				Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}}),
		},
		{
			name: "read-only path with no /proc mount", readonly: []string{"/proc/sys"},
			want: []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"ro", "nosuid", "nodev", "noexec"}}},
		},
		{
			name: "read-only /proc/sys with /proc rw", readonly: []string{"/proc/sys"},
			mounts: []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"rw"}}},
			want:   []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"ro"}}},
		},
		{
			name: "only absent paths", masked: []string{"/proc/kcore", "/sys/devices/virtual/powercap"}, readonly: []string{"/proc/scsi", "/sys/firmware/efi"},
			mounts: baseMounts(), want: baseMounts(),
		},
		{
			name: "unmasked (procMount Unmasked)", mounts: baseMounts(), want: baseMounts(),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &specs.Spec{Mounts: tc.mounts, Linux: &specs.Linux{MaskedPaths: tc.masked, ReadonlyPaths: tc.readonly}}
			if err := MaskedPaths("/run/empty")(s); err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(s.Mounts, tc.want, func(a, b specs.Mount) bool {
				return a.Destination == b.Destination && a.Type == b.Type && a.Source == b.Source && slices.Equal(a.Options, b.Options)
			}) {
				t.Fatalf("mounts\n got %+v\nwant %+v", s.Mounts, tc.want)
			}
		})
	}
}

func TestMaskedPathsRefuses(t *testing.T) {
	for _, tc := range []struct {
		name             string
		masked, readonly []string
		kind             error
		msg              string
	}{
		{"image path", []string{"/etc/shadow"}, nil, errdefs.ErrInvalidArgument, "maskedPaths /etc/shadow: hutch enforces these only in the sandbox's /proc and /sys"},
		{"read-only image path", nil, []string{"/usr"}, errdefs.ErrInvalidArgument, "readonlyPaths /usr"},
		{"process entry", []string{"/proc/1/environ"}, nil, errdefs.ErrInvalidArgument, "cannot tell"},
		{"symlink", []string{"/proc/self/mem"}, nil, errdefs.ErrInvalidArgument, "cannot tell"},
		{"deeper than known", nil, []string{"/proc/sys/kernel/hostname"}, errdefs.ErrInvalidArgument, "cannot tell"},
		{"all of proc", []string{"/proc"}, nil, errdefs.ErrInvalidArgument, "cannot mask all of /proc"},
		{"relative", []string{"proc/kcore"}, nil, errdefs.ErrInvalidArgument, "not a clean absolute path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &specs.Spec{Mounts: baseMounts(), Linux: &specs.Linux{MaskedPaths: tc.masked, ReadonlyPaths: tc.readonly}}
			err := MaskedPaths("/run/empty")(s)
			if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("got %v, want %v containing %q", err, tc.kind, tc.msg)
			}
		})
	}
}
