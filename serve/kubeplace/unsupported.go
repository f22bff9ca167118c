package kubeplace

import (
	"context"
	"fmt"
	"io"
	"time"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/envdpb/filesystempb/filesystempbconnect"
	"hutch.dev/hutch/serve/placement"
	"hutch.dev/hutch/serve/tenant"
)

// notOnKube is why Kubernetes placement does not serve a call.
func notOnKube(what string) error {
	return fmt.Errorf("%s is not supported when hutch serve places sandboxes on Kubernetes (--kubeconfig): %w", what, placement.ErrNotImplemented)
}

// Unsupported: pods have no network updates, metrics, logs, template
// listing, volumes or filesystem service; snapshots need the node
// service; of a create's fields, no mcp, iam, volumeMounts, autoPause or
// allowOut lists.
func (k *Placement) Unsupported(f placement.Feature, what string) error {
	switch f {
	case placement.FeatureNetworkUpdate, placement.FeatureMetrics, placement.FeatureLogs, placement.FeatureTemplates, placement.FeatureVolumes,
		placement.FeatureCheckpoints:
		return notOnKube(what)
	case placement.FeatureSnapshots:
		if k.cfg.Nodes == nil {
			return errNoNodeService
		}
	case placement.FeatureFilesystem:
		return fmt.Errorf("%s is not supported when hutch serve places sandboxes on Kubernetes: use /files: %w", what, placement.ErrNotImplemented)
	case placement.FeatureMCP, placement.FeatureIAM, placement.FeatureVolumeMounts:
		return fmt.Errorf("%s is not supported when hutch serve places sandboxes on Kubernetes: %w", what, placement.ErrNotImplemented)
	case placement.FeatureAutoPause:
		return fmt.Errorf("%s is not supported when hutch serve places sandboxes on Kubernetes (a sandbox ends at its timeout; pause it by the API): %w", what, placement.ErrNotImplemented)
	case placement.FeatureAllowOut:
		return fmt.Errorf("%s are not supported when hutch serve places sandboxes on Kubernetes (the cluster's NetworkPolicies govern pod egress): %w", what, placement.ErrNotImplemented)
	}
	return nil
}

// UpdateNetwork is not served: the cluster's NetworkPolicies govern pods.
func (k *Placement) UpdateNetwork(context.Context, string, string, []string) error {
	return k.Unsupported(placement.FeatureNetworkUpdate, "changing a sandbox's network")
}

// Stats is not served.
func (k *Placement) Stats(context.Context, string) (*engine.Stats, error) {
	return nil, k.Unsupported(placement.FeatureMetrics, "sandbox metrics")
}

// Logs is not served.
func (k *Placement) Logs(context.Context, string, io.Writer) error {
	return k.Unsupported(placement.FeatureLogs, "sandbox logs")
}

// ListTemplates is not served.
func (k *Placement) ListTemplates(context.Context, string) ([]placement.Template, error) {
	return nil, k.Unsupported(placement.FeatureTemplates, "listing templates")
}

// Volumes are not served on Kubernetes placement: they take no disk.
func (k *Placement) CreateVolume(context.Context, string, string) error {
	return k.Unsupported(placement.FeatureVolumes, "volumes")
}

func (k *Placement) GetVolume(context.Context, string, string) error {
	return k.Unsupported(placement.FeatureVolumes, "volumes")
}

func (k *Placement) ListVolumes(context.Context, string) ([]string, error) {
	return nil, k.Unsupported(placement.FeatureVolumes, "volumes")
}

func (k *Placement) DeleteVolume(context.Context, string, string) error {
	return k.Unsupported(placement.FeatureVolumes, "volumes")
}

func (k *Placement) VolumesDisk(context.Context, string) (int64, error) { return 0, nil }

// Filesystem is nil: only /files reaches a pod's files.
func (k *Placement) Filesystem() filesystempbconnect.FilesystemHandler { return nil }

// Forget holds nothing to drop: a pause or a remove drops the sandbox's
// agent endpoint itself.
func (k *Placement) Forget(string) {}

// Close holds nothing to release.
func (k *Placement) Close() error { return nil }

// Checkpoints are not served: a pod's checkpoints stay on its node, which
// keeps none of a tree.
func (k *Placement) Checkpoint(context.Context, string, engine.CheckpointRequest) (engine.CheckpointInfo, error) {
	return engine.CheckpointInfo{}, k.Unsupported(placement.FeatureCheckpoints, "checkpoints")
}

// Checkpoints is not served (Checkpoint).
func (k *Placement) Checkpoints(context.Context, string) ([]engine.CheckpointInfo, error) {
	return nil, k.Unsupported(placement.FeatureCheckpoints, "checkpoints")
}

// RemoveCheckpoint is not served (Checkpoint).
func (k *Placement) RemoveCheckpoint(context.Context, string, string) error {
	return k.Unsupported(placement.FeatureCheckpoints, "checkpoints")
}

// Restore is not served (Checkpoint).
func (k *Placement) Restore(context.Context, string, string) (*engine.Sandbox, error) {
	return nil, k.Unsupported(placement.FeatureCheckpoints, "restoring a checkpoint")
}

// DiffCheckpoints is not served (Checkpoint).
func (k *Placement) DiffCheckpoints(context.Context, string, string, string) ([]engine.CheckpointChange, error) {
	return nil, k.Unsupported(placement.FeatureCheckpoints, "checkpoint diffs")
}

// ForkFrom is not served (Checkpoint).
func (k *Placement) ForkFrom(context.Context, *engine.Sandbox, string, int, time.Duration) ([]placement.Forked, error) {
	return nil, k.Unsupported(placement.FeatureCheckpoints, "forks from checkpoints")
}

// CheckpointsUsage is nothing: there are none.
func (k *Placement) CheckpointsUsage(context.Context, string) (tenant.Usage, error) {
	return tenant.Usage{}, nil
}
