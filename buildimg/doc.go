// Package buildimg builds images for hutch with BuildKit and makes the
// default image, base.
//
// Builds go through BuildKit's Go client (client.Solve with the dockerfile
// frontend) to a buildkitd that the package runs for hutch when the caller
// names none: Daemon starts it on demand under a small supervisor
// (Supervise, the hutch-buildkitd binary), which stops it when it has been
// idle for a while. That buildkitd has no network (its own network
// namespace), and its OCI worker runs every RUN step under gVisor through
// hutch-buildkit-runtime (buildimg/ociworker). A daemon with a build
// allow list (Daemon.Allow, one daemon per list) gives each RUN step a
// sandbox network of its own in mode allow, made by the assembly in the
// supervisor (stepnet.go; docs/decisions/0056-build-step-network.md). For an unprivileged user
// the supervisor runs buildkitd as root of user, mount, network and PID
// namespaces of the user's own, mapped to the user's subordinate IDs
// (rootless.go; docs/decisions/0027-rootless-builds.md); its RUN steps
// still run under gVisor.
//
// Images come from and go to hutch's own store (overlay): every stored image
// is offered to the build as a named context, so `FROM <image>` resolves
// locally and never reaches a registry, and the result is exported straight
// into the store's content and tagged there.
//
// Its state lives under one directory (Daemon.Dir, <root>/buildkit):
//
//	buildkitd.sock   the daemon's socket
//	state/           buildkitd's own state and build cache
//	runsc/           runsc's state for running build steps
//	supervisor.pid   the supervisor's PID while it runs
//	lock, use.lock   flock(2) files: starting, and builds in progress
//	last-used        touched when a build ends: the idle clock
//	buildkitd.log    the daemon's and supervisor's log
//
// The package parses no flags and prints nothing for humans: progress goes
// to the caller as BuildKit's own status stream.
package buildimg
