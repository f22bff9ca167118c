package kubeplace

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/kubenode"
	"hutch.dev/hutch/serve/kube"
	"hutch.dev/hutch/serve/placement"
	"hutch.dev/hutch/serve/tenant"
)

// Snapshots on Kubernetes placement: a checkpoint of a running sandbox,
// memory and files, taken by its node's node service with the sandbox
// left running, and kept on that node. A create from the snapshot's ID
// makes a pod on that node restored from it (the shim's
// dev.hutch.restore), as a resume does, as many times as asked: each new
// sandbox carries on the snapshot's processes and files. The snapshot is
// a Secret of the server (its ID's hash names it, so two snapshots of one
// name cannot both be made) holding the pod to make, the node, the
// checkpoint's name and the source's agent key, which the restored agent
// holds in its memory.

const (
	// kubeLabelKind marks a Secret of the server that is not a sandbox's.
	kubeLabelKind    = "hutch.dev/kind"
	kubeKindSnapshot = "snapshot"
	// kubeLabelSnapshotOf is the ID of the sandbox a snapshot was made of.
	kubeLabelSnapshotOf = "hutch.dev/snapshot-of"
	// kubeAnnSnapshot is the snapshot's ID (its templateID).
	kubeAnnSnapshot = "hutch.dev/snapshot"
	// kubeAnnCheckpointBytes is the size of a snapshot's checkpoint on
	// its node, which its tenant's disk quota counts.
	kubeAnnCheckpointBytes = "hutch.dev/checkpoint-bytes"
)

// kubeRestore is what a create restores a new sandbox's pod from.
type kubeRestore struct {
	// Checkpoint is the checkpoint's name on Node (HostIP).
	Checkpoint, Node string
	// Key is the agent key the checkpoint's agent holds ("": no network).
	Key string
}

// snapshotSecretName is the name of tenant's snapshot id's Secret.
func snapshotSecretName(tenantName, id string) string {
	h := sha256.Sum256([]byte(tenantName + "\x00" + id))
	return "hutch-snap-" + hex.EncodeToString(h[:20])
}

// recreated is pod p as the server makes it again from a checkpoint: what
// the server wrote, without its deadline or what marks a pause, with when
// the sandbox was first created (kubeAnnCreated).
func recreated(p *kube.Pod) kube.Pod {
	again := kube.Pod{APIVersion: "v1", Kind: "Pod", Metadata: kube.Meta{
		Name: p.Metadata.Name, Namespace: p.Metadata.Namespace,
		Labels: maps.Clone(p.Metadata.Labels), Annotations: maps.Clone(p.Metadata.Annotations),
	}, Spec: p.Spec}
	delete(again.Metadata.Annotations, kubeAnnDeadline)
	delete(again.Metadata.Annotations, kubeAnnPausing)
	delete(again.Metadata.Annotations, kubeShimRestore)
	if _, ok := again.Metadata.Annotations[kubeAnnCreated]; !ok && p.Metadata.CreationTimestamp != nil {
		again.Metadata.Annotations[kubeAnnCreated] = p.Metadata.CreationTimestamp.UTC().Format(time.RFC3339Nano)
	}
	return again
}

// snapshotRecord is tenant's snapshot id, nil if there is none.
func (k *Placement) snapshotRecord(ctx context.Context, tenantName, id string) (*kube.Secret, error) {
	sec, err := k.c.GetSecret(ctx, k.cfg.Namespace, snapshotSecretName(tenantName, id))
	if errdefs.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	l := sec.Metadata.Labels
	if l[kubeLabelManaged] != kubeManagedBy || l[kubeLabelKind] != kubeKindSnapshot || l[kubeLabelTenant] != tenantName ||
		sec.Metadata.Annotations[kubeAnnSnapshot] != id {
		return nil, nil
	}
	return sec, nil
}

// snapshot checkpoints running sandbox id, left running, as tenant's
// snapshot name.
func (k *Placement) snapshot(ctx context.Context, id, tenantName, name string) error {
	if k.cfg.Nodes == nil {
		return errNoNodeService
	}
	p, err := k.c.GetPod(ctx, k.cfg.Namespace, kubePodName(id))
	if err != nil {
		return err
	}
	if !p.Running(kubeContainer) || p.Metadata.Annotations[kubeAnnPausing] != "" {
		return fmt.Errorf("sandbox %s is not running: %w", id, errdefs.ErrConflict)
	}
	if p.Status.HostIP == "" || p.Spec.NodeName == "" {
		return fmt.Errorf("sandbox %s: its pod has no node address: %w", id, errdefs.ErrUnavailable)
	}
	data := map[string][]byte{}
	if !podOnAPIExec(p) {
		sec, err := k.c.GetSecret(ctx, k.cfg.Namespace, kubePodName(id))
		if err != nil {
			return fmt.Errorf("sandbox %s: the agent's key: %w", id, err)
		}
		data[kubeAgentSecretKey] = sec.Data[kubeAgentSecretKey]
	}
	again := recreated(p)
	if data[kubePausedPodKey], err = json.Marshal(again); err != nil {
		return err
	}
	ckpt := kubeNewID()
	res, err := k.cfg.Nodes.Checkpoint(ctx, p.Status.HostIP, kubenode.CheckpointRequest{
		Namespace: k.cfg.Namespace, Pod: p.Metadata.Name, PodUID: p.Metadata.UID, Name: ckpt, LeaveRunning: true,
	})
	if err != nil {
		return fmt.Errorf("sandbox %s: checkpoint on node %s: %w", id, p.Spec.NodeName, err)
	}
	sec := &kube.Secret{
		APIVersion: "v1", Kind: "Secret", Type: "Opaque",
		Metadata: kube.Meta{
			Name: snapshotSecretName(tenantName, name), Namespace: k.cfg.Namespace,
			Labels: map[string]string{kubeLabelManaged: kubeManagedBy, kubeLabelTenant: tenantName,
				kubeLabelKind: kubeKindSnapshot, kubeLabelSnapshotOf: id},
			Annotations: map[string]string{kubeAnnSnapshot: name, kubeAnnCheckpoint: ckpt,
				kubeAnnNode: p.Spec.NodeName, kubeAnnHostIP: p.Status.HostIP,
				kubeAnnCheckpointBytes: strconv.FormatInt(res.Bytes, 10)},
		},
		Data: data,
	}
	if err := k.c.CreateSecret(ctx, k.cfg.Namespace, sec); err != nil {
		k.cfg.Nodes.Remove(context.WithoutCancel(ctx), p.Status.HostIP, kubenode.RemoveRequest{Namespace: k.cfg.Namespace, Name: ckpt}) //nolint:errcheck // best effort
		if errdefs.IsAlreadyExists(err) {
			return fmt.Errorf("snapshot %q already exists: %w", name, errdefs.ErrConflict)
		}
		return err
	}
	return nil
}

// removeSnapshot deletes snapshot sec: its checkpoint, then its Secret.
func (k *Placement) removeSnapshot(ctx context.Context, sec *kube.Secret) error {
	a := sec.Metadata.Annotations
	if k.cfg.Nodes == nil {
		return errNoNodeService
	}
	if placement.ValidID(a[kubeAnnCheckpoint]) && a[kubeAnnHostIP] != "" {
		if err := k.cfg.Nodes.Remove(ctx, a[kubeAnnHostIP], kubenode.RemoveRequest{Namespace: k.cfg.Namespace, Name: a[kubeAnnCheckpoint]}); err != nil {
			return fmt.Errorf("snapshot %q: its checkpoint on node %s: %w", a[kubeAnnSnapshot], a[kubeAnnNode], err)
		}
	}
	return k.c.DeleteSecret(ctx, k.cfg.Namespace, sec.Metadata.Name)
}

// fromSnapshot fills a create from snapshot sec: the pod of the sandbox
// it was made of, restored on its node.
func fromSnapshot(ks *kubeSandbox, sec *kube.Secret) error {
	var p kube.Pod
	a := sec.Metadata.Annotations
	if json.Unmarshal(sec.Data[kubePausedPodKey], &p) != nil || len(p.Spec.Containers) == 0 || !placement.ValidID(a[kubeAnnCheckpoint]) || a[kubeAnnNode] == "" {
		return fmt.Errorf("snapshot %q: its record %s is unreadable: %w", a[kubeAnnSnapshot], sec.Metadata.Name, errdefs.ErrFailedPrecondition)
	}
	if !fromPod(ks, &p, kubeRestore{Checkpoint: a[kubeAnnCheckpoint], Node: a[kubeAnnNode], Key: string(sec.Data[kubeAgentSecretKey])}) {
		return fmt.Errorf("snapshot %q: its record %s names no sandbox of the server: %w", a[kubeAnnSnapshot], sec.Metadata.Name, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// fromPod fills a create of a sandbox restored by r from a checkpoint of
// pod p's: p's image, limits, network and environment; false if p is no
// sandbox of the server.
func fromPod(ks *kubeSandbox, p *kube.Pod, r kubeRestore) bool {
	src := podSandbox(p)
	if src == nil || len(p.Spec.Containers) == 0 {
		return false
	}
	c := p.Spec.Containers[0]
	ks.Image, ks.CPUs, ks.Memory, ks.Network = c.Image, src.CPUs, src.Memory, src.Network
	ks.Private = src.Labels[placement.LabelPrivate] == "true"
	ks.AutoResume = src.Labels[placement.LabelAutoResume] == "true"
	ks.Env = map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			ks.Env[e.Name] = e.Value
		}
	}
	ks.Restore = &r
	return true
}

// Fork makes count sandboxes restored from one checkpoint of running
// sandbox parent (left running), on its node, each with timeout; the
// checkpoint goes once they run. An error is one of the checkpoint: the
// children's own are in the results.
func (k *Placement) Fork(ctx context.Context, parent *engine.Sandbox, count int, timeout time.Duration) ([]placement.Forked, error) {
	if k.cfg.Nodes == nil {
		return nil, errNoNodeService
	}
	tenantName := parent.Labels[placement.LabelTenant]
	unlock := k.locks.Lock(parent.ID)
	p, err := k.c.GetPod(ctx, k.cfg.Namespace, kubePodName(parent.ID))
	if err != nil {
		unlock()
		return nil, err
	}
	if !p.Running(kubeContainer) || p.Metadata.Annotations[kubeAnnPausing] != "" || p.Status.HostIP == "" {
		unlock()
		return nil, fmt.Errorf("sandbox %s is not running: %w", parent.ID, errdefs.ErrConflict)
	}
	r := kubeRestore{Checkpoint: kubeNewID(), Node: p.Spec.NodeName}
	if !podOnAPIExec(p) {
		sec, err := k.c.GetSecret(ctx, k.cfg.Namespace, p.Metadata.Name)
		if err != nil {
			unlock()
			return nil, fmt.Errorf("sandbox %s: the agent's key: %w", parent.ID, err)
		}
		r.Key = string(sec.Data[kubeAgentSecretKey])
	}
	_, err = k.cfg.Nodes.Checkpoint(ctx, p.Status.HostIP, kubenode.CheckpointRequest{
		Namespace: k.cfg.Namespace, Pod: p.Metadata.Name, PodUID: p.Metadata.UID, Name: r.Checkpoint, LeaveRunning: true,
	})
	unlock()
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: checkpoint on node %s: %w", parent.ID, p.Spec.NodeName, err)
	}
	defer func() {
		// The children hold the checkpoint's files open once restored.
		if err := k.cfg.Nodes.Remove(context.WithoutCancel(ctx), p.Status.HostIP, kubenode.RemoveRequest{Namespace: k.cfg.Namespace, Name: r.Checkpoint}); err != nil {
			k.log.Warn("remove a fork's checkpoint", "sandbox", parent.ID, "node", p.Spec.NodeName, "err", err)
		}
	}()
	var meta map[string]string
	json.Unmarshal([]byte(p.Metadata.Annotations[kubeAnnMetadata]), &meta) //nolint:errcheck // none is none
	out := make([]placement.Forked, count)
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ks := kubeSandbox{ID: kubeNewID(), Tenant: tenantName, Template: p.Metadata.Annotations[kubeAnnTemplate],
				Metadata: meta, Timeout: timeout, Now: time.Now()}
			fromPod(&ks, p, r)
			kid, err := k.create(ctx, ks)
			out[i] = placement.Forked{Sandbox: kid, Err: err}
		}()
	}
	wg.Wait()
	return out, nil
}

// CheckSnapshotName refuses a snapshot named as a template of the
// server's (Config.Templates): a create from it would not find it.
func (k *Placement) CheckSnapshotName(_, name string) error {
	if _, ok := k.cfg.Templates[name]; ok {
		return fmt.Errorf("name %q is a template of this server: %w", name, errdefs.ErrConflict)
	}
	return nil
}

func (k *Placement) HasSnapshot(ctx context.Context, tenantName, name string) (bool, error) {
	rec, err := k.snapshotRecord(ctx, tenantName, name)
	return rec != nil, err
}

// Snapshot checkpoints running sandbox id, left running, as tenant's
// snapshot name, one at a time per sandbox with its resumes.
func (k *Placement) Snapshot(ctx context.Context, id, tenantName, name string) error {
	unlock := k.locks.Lock(id)
	defer unlock()
	if err := k.snapshot(ctx, id, tenantName, name); err != nil {
		return err
	}
	k.log.Info("snapshot", "sandbox", id, "tenant", tenantName, "snapshot", name)
	return nil
}

// ListSnapshots are tenant's snapshots, by their Secrets.
func (k *Placement) ListSnapshots(ctx context.Context, tenantName, sandboxID, name string) ([]string, error) {
	sel := k.selector(tenantName) + "," + kubeLabelKind + "=" + kubeKindSnapshot
	if sandboxID != "" {
		if !placement.ValidID(sandboxID) {
			return nil, nil
		}
		sel += "," + kubeLabelSnapshotOf + "=" + sandboxID
	}
	recs, err := k.c.ListSecrets(ctx, k.cfg.Namespace, sel)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, rec := range recs {
		id := rec.Metadata.Annotations[kubeAnnSnapshot]
		if id == "" || rec.Metadata.Name != snapshotSecretName(tenantName, id) || (name != "" && id != name) {
			continue
		}
		out = append(out, id)
	}
	return out, nil
}

// SnapshotsUsage counts the tenant's snapshots by their Secrets; each
// takes the disk of its checkpoint on its node, or, for a record that
// does not say, the sandbox's it was made of (its disk and memory, what a
// checkpoint holds at most).
func (k *Placement) SnapshotsUsage(ctx context.Context, tenantName string) (tenant.Usage, error) {
	recs, err := k.c.ListSecrets(ctx, k.cfg.Namespace, k.selector(tenantName)+","+kubeLabelKind+"="+kubeKindSnapshot)
	if err != nil {
		return tenant.Usage{}, err
	}
	var u tenant.Usage
	for i := range recs {
		rec := &recs[i]
		u.Snapshots++
		if n, err := strconv.ParseInt(rec.Metadata.Annotations[kubeAnnCheckpointBytes], 10, 64); err == nil && n >= 0 {
			u.Disk += n
			continue
		}
		var p kube.Pod
		json.Unmarshal(rec.Data[kubePausedPodKey], &p) //nolint:errcheck // an unreadable record counts hutch's defaults
		src := podSandbox(&p)
		if src == nil {
			src = &engine.Sandbox{}
		}
		bound := placement.UsageOf(src.CPUs, src.Memory, src.Disk)
		u.Disk += bound.Disk + bound.Memory
	}
	return u, nil
}

// DeleteTemplate removes one of the tenant's snapshots. The server's
// templates (Config.Templates) are not the API's to delete.
func (k *Placement) DeleteTemplate(ctx context.Context, tenantName, id string) error {
	rec, err := k.snapshotRecord(ctx, tenantName, id)
	if err != nil {
		return err
	}
	if rec == nil {
		if _, ok := k.cfg.Templates[id]; ok {
			return fmt.Errorf("template %q is the server's (--template), not a snapshot: %w", id, errdefs.ErrFailedPrecondition)
		}
		return fmt.Errorf("template %q not found: %w", id, errdefs.ErrNotFound)
	}
	if err := k.removeSnapshot(ctx, rec); err != nil {
		return err
	}
	k.log.Info("snapshot removed", "tenant", tenantName, "snapshot", id)
	return nil
}
