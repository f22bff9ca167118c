package runsc

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"gvisor.dev/gvisor/pkg/abi/linux"
	"gvisor.dev/gvisor/pkg/sentry/control"
	"gvisor.dev/gvisor/pkg/sentry/kernel/auth"
	"gvisor.dev/gvisor/pkg/urpc"
)

// TestCtlExecArgsDecodeAsRunsc encodes the exec message as hutch sends it and
// decodes it into the pinned runsc's own control.ExecArgs, as the sandbox
// does: every field must arrive, under the name runsc reads.
func TestCtlExecArgsDecodeAsRunsc(t *testing.T) {
	caps, err := ctlCapsOf(&specs.LinuxCapabilities{
		Bounding:  []string{"CAP_CHOWN", "CAP_KILL", "CAP_NET_RAW"},
		Effective: []string{"CAP_KILL"},
		Permitted: []string{"CAP_KILL", "CAP_SETUID"},
		Ambient:   []string{"CAP_SETGID"},
	})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sent := &ctlExecArgs{
		FilePayload:      urpc.FilePayload{Files: []*os.File{f, f, f}},
		GuestFDs:         []int{0, 1, 2},
		Argv:             []string{"echo", "hi"},
		Envv:             []string{"PATH=/bin", "A=b"},
		WorkingDirectory: "/tmp",
		KUID:             1000,
		KGID:             1001,
		ExtraKGIDs:       []uint32{5, 6},
		NoNewPrivileges:  true,
		Capabilities:     caps,
		SupportTTYs:      true,
		ContainerID:      "c1",
	}
	b, err := json.Marshal(sent)
	if err != nil {
		t.Fatal(err)
	}
	var got control.ExecArgs
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := control.ExecArgs{
		Argv:             sent.Argv,
		Envv:             sent.Envv,
		WorkingDirectory: "/tmp",
		KUID:             1000,
		KGID:             1001,
		ExtraKGIDs:       []auth.KGID{5, 6},
		NoNewPrivileges:  true,
		Capabilities: &auth.TaskCapabilities{
			BoundingCaps:  auth.CapabilitySetOfMany([]linux.Capability{linux.CAP_CHOWN, linux.CAP_KILL}),
			EffectiveCaps: auth.CapabilitySetOf(linux.CAP_KILL),
			PermittedCaps: auth.CapabilitySetOfMany([]linux.Capability{linux.CAP_KILL, linux.CAP_SETUID}),
			AmbientCaps:   auth.CapabilitySetOf(linux.CAP_SETGID),
		},
		SupportTTYs: true,
		FilePayload: control.FilePayload{GuestFDs: []int{0, 1, 2}},
		ContainerID: "c1",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("runsc decodes\n%+v (caps %+v)\nwant\n%+v (caps %+v)", got, got.Capabilities, want, want.Capabilities)
	}
}

// The export's message decodes into the pinned runsc's own
// control.TarRootfsUpperLayerOpts.
func TestCtlTarArgsDecodeAsRunsc(t *testing.T) {
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := json.Marshal(&ctlTarArgs{ContainerID: "c1", FilePayload: urpc.FilePayload{Files: []*os.File{f}}})
	if err != nil {
		t.Fatal(err)
	}
	var got control.TarRootfsUpperLayerOpts
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.ContainerID != "c1" {
		t.Errorf("runsc decodes %+v", got)
	}
	// urpc names a method TYPE.METHOD of the object registered.
	typ := reflect.TypeOf(control.Fs{})
	if _, ok := reflect.PointerTo(typ).MethodByName(strings.TrimPrefix(ctlTarRootfsUpper, typ.Name()+".")); !ok || !strings.HasPrefix(ctlTarRootfsUpper, typ.Name()+".") {
		t.Errorf("method %q is not one of runsc's %s", ctlTarRootfsUpper, typ)
	}
}

// TestGvisorPinsAgree: the control socket's messages are those of the
// gVisor version this module builds against; runsc is built from
// tools/runsc. The two pins must be the same version.
func TestGvisorPinsAgree(t *testing.T) {
	pin := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(l), "require "))
			if len(f) >= 2 && f[0] == "gvisor.dev/gvisor" {
				return f[1]
			}
		}
		t.Fatalf("%s does not require gvisor.dev/gvisor", path)
		return ""
	}
	main, tools := pin("../go.mod"), pin("../tools/runsc/go.mod")
	if main != tools {
		t.Fatalf("go.mod has gvisor.dev/gvisor %s, tools/runsc/go.mod (the runsc that runs) %s", main, tools)
	}
}
