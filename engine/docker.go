package engine

import (
	"fmt"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/overlay"
	"hutch.dev/hutch/runsc"
)

// DockerImage is the image of a Docker sandbox whose create names none:
// base with Debian's Docker Engine and Compose, its daemon running in every
// sandbox of it (`make docker-image`, then
// `hutch image import docker bin/images/docker.tar`; docs/docker.md).
const DockerImage = "docker:latest"

// LabelDocker, set to "true" on an image, makes every sandbox of it a
// Docker sandbox (CreateRequest.Docker): its template's daemon needs what
// that grants.
const LabelDocker = "dev.hutch.docker"

// wantsDocker reports whether img asks for Docker sandboxes (LabelDocker).
func wantsDocker(img overlay.Image) bool {
	return img.Config.Config.Labels[LabelDocker] == "true"
}

// checkDocker refuses a Docker sandbox where one cannot work.
func (e *Engine) checkDocker(docker bool) error {
	if docker && e.opts.NoDocker {
		return fmt.Errorf("--docker: Docker sandboxes are turned off on this host (hutch serve --no-docker): %w", errdefs.ErrPermissionDenied)
	}
	if docker && e.rootless {
		return fmt.Errorf("--docker: %s: %w", dockerRootlessWhy, errdefs.ErrInvalidArgument)
	}
	return nil
}

// dockerRootlessWhy says why a rootless host runs no Docker sandbox.
const dockerRootlessWhy = "a rootless sandbox cannot run Docker: runsc without root has no cgroups to give the daemon's containers (it runs with --ignore-cgroups) and no network link of its own for their bridge; create it as root"

// dockerColdReason says why a Docker sandbox boots its template cold.
const dockerColdReason = "a Docker sandbox's bridge, its NAT rule and its containers' links live in gVisor's netstack, which a restore into a new sandbox does not bring back: its daemon starts in each sandbox (about a second)"

// dockerNoCheckpointWhy says why a Docker sandbox is not checkpointed.
const dockerNoCheckpointWhy = "the pinned gVisor cannot save the bridge its daemon makes in the sandbox's netstack (runsc checkpoint fails: stack.BridgeFDBEntry has no state saver), and a failed checkpoint leaves the inner containers' links broken"

// capsFor is the capability set of sb's processes that run as root:
// every capability of gVisor's kernel in a Docker sandbox, else runsc's
// default set.
func capsFor(sb *record) []string {
	if sb.Docker {
		return append([]string(nil), runsc.AllCapabilities...)
	}
	return append([]string(nil), runsc.DefaultCapabilities...)
}
