package sandbox

import (
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/engine"
)

// warnUnenforced says on stderr which limits of a new rootless sandbox
// nothing enforces (the host gives its user no cgroup for them).
func warnUnenforced(c *cli.Context, e *engine.Engine, sb *engine.Sandbox) {
	if sb == nil || len(sb.UnenforcedLimits) == 0 {
		return
	}
	w := c.App.ErrWriter
	if w == nil {
		w = os.Stderr
	}
	flags := make([]string, len(sb.UnenforcedLimits))
	for i, l := range sb.UnenforcedLimits {
		flags[i] = "--" + l
	}
	fmt.Fprintf(w, "hutch: warning: %s not enforced for sandbox %s: %s (see hutch doctor)\n",
		strings.Join(flags, " and "), sb.ShortID(), e.Limits().Why)
}
