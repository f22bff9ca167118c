//go:build tools

// Package runsc pins the gVisor runsc build that hutch drives. It lives in its
// own module so that gVisor's dependency pins never meet BuildKit's or
// containerd's in the main module.
package runsc

import _ "gvisor.dev/gvisor/runsc"
