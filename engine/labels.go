package engine

import (
	"context"
	"fmt"
	"maps"

	"github.com/containerd/errdefs"
)

// SetLabels sets labels of sandbox ref's record and keeps its others; a
// label set to "" is removed. The sandbox may be running, paused or
// stopped, and keeps the labels through pause, resume and fork. A sandbox
// whose create is under way is refused: its create writes the record
// last.
func (e *Engine) SetLabels(ctx context.Context, ref string, set map[string]string) (*Sandbox, error) {
	for k := range set {
		if k == "" {
			return nil, fmt.Errorf("label: an empty key: %w", errdefs.ErrInvalidArgument)
		}
	}
	sb, unlock, err := e.getLocked(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if sb.State == StateCreating {
		return nil, fmt.Errorf("sandbox %s is being created: %w", sb.ShortID(), errdefs.ErrFailedPrecondition)
	}
	labels := maps.Clone(sb.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	for k, v := range set {
		if v == "" {
			delete(labels, k)
		} else {
			labels[k] = v
		}
	}
	sb.Labels = labels
	if err := e.save(sb); err != nil {
		return nil, err
	}
	return sb.view(), nil
}
