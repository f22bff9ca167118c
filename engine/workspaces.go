package engine

import (
	"context"
	"fmt"

	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/engine/workspace"
)

// Change is one path of an :overlay workspace that differs from its host
// directory (workspace.Change).
type Change = workspace.Change

// WorkspaceDiff is the changes of one :overlay workspace (workspace.Diff).
type WorkspaceDiff = workspace.Diff

// Change kinds of a workspace.
const (
	ChangeAdded    = workspace.ChangeAdded
	ChangeModified = workspace.ChangeModified
	ChangeDeleted  = workspace.ChangeDeleted
)

// makeWorkspaces creates and mounts a workspace for each :overlay mount
// of ms, and points its spec mount (sm[i], rendered from ms[i]) at the
// merged directory. The mounts are undone by destroyRuntime.
func (e *Engine) makeWorkspaces(ctx context.Context, id string, ms []Mount, sm []specs.Mount, undo *assembly.Undo) error {
	n := 0
	for i, m := range ms {
		if !m.Overlay {
			continue
		}
		w, err := workspace.Create(e.sandboxDir(id), n, sm[i].Source, m.Target, e.rootless)
		if err != nil {
			return err
		}
		n++
		undo.Add(func() { workspace.UnmountAll(e.sandboxDir(id)) }) //nolint:errcheck // best effort undo
		if err := w.Mount(ctx); err != nil {
			return fmt.Errorf("overlay workspace of %s at %s: %w", w.Source, w.Target, err)
		}
		sm[i].Source = w.Merged()
		log.G(ctx).WithField("target", w.Target).Debug("overlay workspace mounted")
	}
	return nil
}

// Diff returns the changes of sandbox ref's :overlay workspaces against
// their host directories, by path; with path (a path in the sandbox),
// only the changes at or below it. It reads the workspaces' layers on the
// host, so it works whether the sandbox runs, is paused or stopped.
func (e *Engine) Diff(ctx context.Context, ref, path string) ([]WorkspaceDiff, error) {
	sb, err := e.Get(ctx, ref)
	if err != nil {
		return nil, err
	}
	return workspace.Diffs(e.sandboxDir(sb.ID), sb.ShortID(), path)
}

// ApplyDiff copies the changes Diff reports (with path, those at or below
// it) to the host directories of sandbox ref's :overlay workspaces, as
// workspace.Apply does, holding the sandbox's lock. It returns what it
// applied.
func (e *Engine) ApplyDiff(ctx context.Context, ref, path string) ([]WorkspaceDiff, error) {
	sb, unlock, err := e.getLocked(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer unlock()
	ds, err := workspace.Diffs(e.sandboxDir(sb.ID), shortID(sb.ID), path)
	if err != nil {
		return nil, err
	}
	for _, d := range ds {
		if err := workspace.Apply(ctx, d); err != nil {
			return nil, fmt.Errorf("apply %s to %s: %w", d.Target, d.Source, err)
		}
	}
	return ds, nil
}
