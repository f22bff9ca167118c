package engine

import (
	"context"

	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/egress"
)

// EgressEntry is one connection in a sandbox's egress log.
type EgressEntry = egress.Entry

// EgressLog returns sandbox ref's egress log, oldest first: every web
// connection its gateway judged, with the decision and the rule that made
// it. A sandbox whose web connections never met a gateway (no network,
// rootless, never in mode allow) has none.
func (e *Engine) EgressLog(ctx context.Context, ref string) ([]EgressEntry, error) {
	sb, err := e.get(ctx, ref)
	if err != nil {
		return nil, err
	}
	return egress.ReadLog(assembly.EgressLogPath(e.sandboxDir(sb.ID)))
}
