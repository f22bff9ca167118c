// Package ociworker is the runtime binary behind hutch's BuildKit: buildkitd
// execs it where it would exec runc (--oci-worker-binary), so that every
// RUN step of a Dockerfile runs under gVisor.
//
// It speaks the part of runc's command line that BuildKit's OCI worker uses
// (run, create, start, exec, kill, state, delete) and execs runsc with it,
// changed in three ways that runsc needs:
//
//   - runc-only flags (--keep, --no-pivot, --no-new-keyring, --rootless) are
//     dropped; runsc removes a container when its init exits, which is what
//     BuildKit asks for after a step anyway;
//   - delete of a container runsc no longer knows succeeds, as it does for
//     runc after --keep;
//   - every sandbox gets --overlay2=none, so that a step's writes reach the
//     BuildKit snapshot mounted as its rootfs (with gVisor's own overlay they
//     stay inside the sandbox and the layer comes out empty), and
//     --network=none: build steps have no network, unless the daemon has
//     an allow list (below).
//
// Its configuration comes from the environment of buildkitd, which hutch
// sets: EnvRunsc (the runsc binary), EnvRoot (runsc's state directory) and
// EnvPlatform (gVisor's platform, optional) and EnvRootless (set to 1 when
// buildkitd runs as root of an unprivileged user's namespace: runsc then
// gets --ignore-cgroups, as the host's cgroups are not the user's).
//
// With EnvNet (the socket of the daemon's supervisor, which holds the
// build allow list) each step that BuildKit gives the default network
// gets one of its own instead: the runtime asks the supervisor for it
// before the step starts (a namespace, link, firewall and resolver, made
// by the assembly as for a sandbox in mode allow) and gives it back when
// BuildKit deletes the step. The step then runs with --network=sandbox
// in that namespace, its /etc/resolv.conf naming the step's resolver, and,
// with EnvCABundle, trusting the host's CA bundle (net.go). A step that
// asked for none (RUN --network=none) keeps none.
//
// It knows nothing of images or of hutch's store; it rewrites a command
// line, and for a step with network the step's OCI spec.
package ociworker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/containerd/log"

	"hutch.dev/hutch/runsc"
)

// Environment variables the runtime reads.
const (
	EnvRunsc    = "HUTCH_OCIWORKER_RUNSC"
	EnvRoot     = "HUTCH_OCIWORKER_ROOT"
	EnvPlatform = "HUTCH_OCIWORKER_PLATFORM"
	EnvRootless = "HUTCH_OCIWORKER_ROOTLESS"
	EnvNet      = "HUTCH_OCIWORKER_NET"
	EnvCABundle = "HUTCH_OCIWORKER_CA_BUNDLE"
)

// globalWithValue are runc's global flags that take a separate value.
var globalWithValue = map[string]bool{"--root": true, "--log": true, "--log-format": true, "--criu": true}

// dropped are flags runsc does not know, with whether they take a value.
var dropped = map[string]bool{
	"--keep": false, "--no-pivot": false, "--no-new-keyring": false,
	"--rootless": true, "--criu": true, "--root": true, "--preserve-fds": true,
}

// Config is what the runtime adds to every runsc call.
type Config struct {
	Runsc    string
	Root     string
	Platform string
	// Rootless adds --ignore-cgroups.
	Rootless bool
	// Net is the socket of the supervisor that makes steps' networks;
	// empty: steps have none.
	Net string
	// CABundle is the host's CA bundle, which steps with a network
	// trust; empty: the image's own.
	CABundle string
}

// ConfigFromEnv reads the Config from the environment.
func ConfigFromEnv() (Config, error) {
	c := Config{
		Runsc: os.Getenv(EnvRunsc), Root: os.Getenv(EnvRoot), Platform: os.Getenv(EnvPlatform),
		Rootless: os.Getenv(EnvRootless) == "1", Net: os.Getenv(EnvNet), CABundle: os.Getenv(EnvCABundle),
	}
	if c.Runsc == "" || c.Root == "" {
		return c, fmt.Errorf("%s and %s must be set (this program is run by hutch's buildkitd)", EnvRunsc, EnvRoot)
	}
	return c, nil
}

// Main runs the runtime with os.Args and never returns.
func Main() {
	c, err := ConfigFromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, "hutch-buildkit-runtime:", err)
		os.Exit(2)
	}
	args, sub, id := c.Translate(os.Args[1:])
	if c.Net != "" {
		var err error
		if args, err = c.network(args, sub, id); err != nil {
			fmt.Fprintln(os.Stderr, "hutch-buildkit-runtime:", err)
			os.Exit(1)
		}
	}
	if sub == "delete" && id != "" && !c.known(id) {
		// Already gone: runsc deleted it when its init exited.
		os.Exit(0)
	}
	argv := append([]string{c.Runsc}, args...)
	err = syscall.Exec(c.Runsc, argv, os.Environ())
	fmt.Fprintf(os.Stderr, "hutch-buildkit-runtime: exec %s: %v\n", c.Runsc, err)
	os.Exit(2)
}

// known reports whether runsc has state for container id.
func (c Config) known(id string) bool {
	return c.runsc().Exists(id)
}

func (c Config) runsc() *runsc.Runsc {
	return &runsc.Runsc{Path: c.Runsc, Root: c.Root, Platform: c.Platform, Network: "none", Overlay: "none", GoferNetNS: "new", IgnoreCgroups: c.Rootless}
}

// Env is the environment that makes the runtime use c.
func (c Config) Env() []string {
	env := []string{EnvRunsc + "=" + c.Runsc, EnvRoot + "=" + c.Root}
	if c.Platform != "" {
		env = append(env, EnvPlatform+"="+c.Platform)
	}
	if c.Rootless {
		env = append(env, EnvRootless+"=1")
	}
	if c.Net != "" {
		env = append(env, EnvNet+"="+c.Net)
	}
	if c.CABundle != "" {
		env = append(env, EnvCABundle+"="+c.CABundle)
	}
	return env
}

// Cleanup force-deletes every container runsc still has state for under
// c.Root: the build steps of a buildkitd that died. Failures are logged.
func (c Config) Cleanup(ctx context.Context) {
	states, _ := filepath.Glob(filepath.Join(c.Root, "*_sandbox:*.state"))
	r := c.runsc()
	for _, st := range states {
		id, _, _ := strings.Cut(filepath.Base(st), "_sandbox:")
		if err := r.Delete(ctx, id, true); err != nil {
			log.G(ctx).WithError(err).WithField("container", id).Warn("removing a build step's sandbox")
		}
	}
}

// Translate turns a runc command line (without the program name) into
// runsc's. It returns the new arguments, the subcommand and the container
// ID for delete.
func (c Config) Translate(in []string) (out []string, sub, id string) {
	out = []string{"--root", c.Root, "--overlay2=none", "--network=none", "--gofer-network-namespace=new"}
	if c.Platform != "" {
		out = append(out, "--platform="+c.Platform)
	}
	if c.Rootless {
		out = append(out, "--ignore-cgroups")
	}
	i := 0
	// Global flags, up to the subcommand.
	for ; i < len(in) && strings.HasPrefix(in[i], "-"); i++ {
		name, _, hasValue := strings.Cut(in[i], "=")
		if name == "--version" || name == "-v" || name == "--help" || name == "-h" {
			return []string{in[i]}, "", ""
		}
		takesValue := globalWithValue[name] && !hasValue
		if _, drop := dropped[name]; drop {
			if takesValue {
				i++
			}
			continue
		}
		out = append(out, in[i])
		if takesValue && i+1 < len(in) {
			i++
			out = append(out, in[i])
		}
	}
	if i == len(in) {
		return out, "", ""
	}
	sub = in[i]
	out = append(out, sub)
	for i++; i < len(in); i++ {
		a := in[i]
		if a == "--" {
			out = append(out, in[i:]...)
			break
		}
		name, _, hasValue := strings.Cut(a, "=")
		if takesValue, drop := dropped[name]; drop {
			if takesValue && !hasValue {
				i++
			}
			continue
		}
		out = append(out, a)
	}
	if sub == "delete" && !strings.HasPrefix(out[len(out)-1], "-") {
		// delete's only flag, --force, takes no value: the ID is last.
		id = out[len(out)-1]
	}
	return out, sub, id
}
