package kubeplace

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/agent/agentnet"
	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/kubenode"
	"hutch.dev/hutch/serve/kube"
	"hutch.dev/hutch/serve/placement"
)

// Pause and resume on Kubernetes placement. Kubernetes has no restore of
// a checkpoint, so hutch does it: hutch's node service (kubenode, run on
// every node by the installer DaemonSet) checkpoints the pod's gVisor
// sandbox, memory and filesystem, through the node's containerd into a
// directory of that node, named by a fresh random name; the server then
// deletes the pod. The sandbox, paused, is a Secret (the one holding its
// agent's key, or a new one for a sandbox without network) that no pod
// owns any more, labelled paused and holding the pod to make again, the
// node and the checkpoint's name. Resume creates that pod on that node
// with the shim's annotation dev.hutch.restore naming the checkpoint: the
// shim restores the sandbox from it instead of booting it, in the pod's
// own namespace only. The processes of the sandbox go on where they
// stopped, with the same agent key, at the new pod's address.

// Names of the paused record (on the sandbox's Secret) and of what the
// server keeps on a pod while it is paused or resumed.
const (
	// kubeLabelPaused marks a Secret that is a paused sandbox.
	kubeLabelPaused = "hutch.dev/paused"
	// kubeAnnCheckpoint is the checkpoint's name on the node.
	kubeAnnCheckpoint = "hutch.dev/checkpoint"
	// kubeAnnNode and kubeAnnHostIP are the node holding it and its
	// address, where its node service listens.
	kubeAnnNode   = "hutch.dev/node"
	kubeAnnHostIP = "hutch.dev/host-ip"
	// kubeAnnCreated is when the sandbox was first created: its pod is
	// made anew at each resume.
	kubeAnnCreated = "hutch.dev/created"
	// kubeAnnPausing marks a pod whose sandbox is being checkpointed
	// (since when): it counts as paused from then on.
	kubeAnnPausing = "hutch.dev/pausing"
	// kubePausedPodKey is the Secret's data key holding the pod (JSON).
	kubePausedPodKey = "pod"
	// kubeShimRestore is the shim's annotation naming the checkpoint a
	// pod's sandbox is restored from.
	kubeShimRestore = "dev.hutch.restore"
)

// errNoNodeService is why pause answers 501 on a server without the node
// service's key.
var errNoNodeService = fmt.Errorf("pause, resume and snapshots on Kubernetes placement need hutch's node service on the nodes (deploy/kubernetes/daemonset.yaml with the Secret hutch-node-key) and its key given to hutch serve with --node-key FILE: %w", errdefs.ErrNotImplemented)

// pausedSandbox is the sandbox a paused record (a Secret labelled paused)
// stands for; nil if sec is no paused record of the server.
func pausedSandbox(sec *kube.Secret) (*engine.Sandbox, *kube.Pod) {
	l := sec.Metadata.Labels
	if l[kubeLabelPaused] != "true" || l[kubeLabelManaged] != kubeManagedBy {
		return nil, nil
	}
	var p kube.Pod
	if json.Unmarshal(sec.Data[kubePausedPodKey], &p) != nil {
		return nil, nil
	}
	p.Status = kube.PodStatus{}
	sb := podSandbox(&p)
	if sb == nil || sb.ID != l[kubeLabelID] || sb.Labels[placement.LabelTenant] != l[kubeLabelTenant] {
		return nil, nil
	}
	sb.State = engine.StatePaused
	sb.Deadline = nil
	return sb, &p
}

// pausedRecord reads sandbox id's paused record: nil, nil if it is not
// paused.
func (k *Placement) pausedRecord(ctx context.Context, id string) (*kube.Secret, error) {
	sec, err := k.c.GetSecret(ctx, k.cfg.Namespace, kubePodName(id))
	if errdefs.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if sec.Metadata.Labels[kubeLabelPaused] != "true" {
		return nil, nil
	}
	return sec, nil
}

// Pause checkpoints sb on its node and deletes its pod, one at a time
// per sandbox with its resumes.
func (k *Placement) Pause(ctx context.Context, sb *engine.Sandbox) error {
	unlock := k.locks.Lock(sb.ID)
	defer unlock()
	res, err := k.pause(ctx, sb.ID)
	if err != nil {
		return err
	}
	k.log.Info("paused", "sandbox", sb.ID, "tenant", sb.Labels[placement.LabelTenant], "checkpoint_bytes", res.Bytes, "checkpoint", res.Duration)
	return nil
}

// pause checkpoints sandbox id on its node and deletes its pod.
func (k *Placement) pause(ctx context.Context, id string) (*kubenode.CheckpointResult, error) {
	if k.cfg.Nodes == nil {
		return nil, errNoNodeService
	}
	name := kubePodName(id)
	p, err := k.c.GetPod(ctx, k.cfg.Namespace, name)
	if err != nil {
		return nil, err
	}
	if !p.Running(kubeContainer) || p.Metadata.Annotations[kubeAnnPausing] != "" {
		return nil, fmt.Errorf("sandbox %s is not running: %w", id, errdefs.ErrConflict)
	}
	if p.Status.HostIP == "" || p.Spec.NodeName == "" {
		return nil, fmt.Errorf("sandbox %s: its pod has no node address: %w", id, errdefs.ErrUnavailable)
	}
	ckpt := kubeNewID()
	networked := !podOnAPIExec(p)

	// The pod as it is to be made again (a paused sandbox does not
	// expire; resume sets its deadline).
	podJSON, err := json.Marshal(recreated(p))
	if err != nil {
		return nil, err
	}

	// Paused from here on for every reader of the server's sandboxes.
	pausing := time.Now().UTC().Format(time.RFC3339Nano)
	if _, err := k.c.PatchPodAnnotations(ctx, k.cfg.Namespace, name, map[string]*string{kubeAnnPausing: &pausing}); err != nil {
		return nil, err
	}
	// The record, before the checkpoint: no longer owned by the pod, so
	// that it outlives it.
	meta := map[string]any{
		"labels":      map[string]string{kubeLabelManaged: kubeManagedBy, kubeLabelID: id, kubeLabelTenant: p.Metadata.Labels[kubeLabelTenant], kubeLabelPaused: "true"},
		"annotations": map[string]string{kubeAnnCheckpoint: ckpt, kubeAnnNode: p.Spec.NodeName, kubeAnnHostIP: p.Status.HostIP},
	}
	if networked {
		meta["ownerReferences"] = nil
		err = k.c.PatchSecret(ctx, k.cfg.Namespace, name, map[string]any{"metadata": meta, "data": map[string][]byte{kubePausedPodKey: podJSON}})
	} else {
		sec := k.agentSecret(id, p.Metadata.Labels[kubeLabelTenant], "")
		sec.Data = map[string][]byte{kubePausedPodKey: podJSON}
		sec.Metadata.Labels[kubeLabelPaused] = "true"
		sec.Metadata.Annotations = meta["annotations"].(map[string]string)
		err = k.c.CreateSecret(ctx, k.cfg.Namespace, sec)
	}
	if err != nil {
		k.unpause(context.WithoutCancel(ctx), p, networked)
		return nil, fmt.Errorf("sandbox %s: record its pause: %w", id, err)
	}
	res, err := k.cfg.Nodes.Checkpoint(ctx, p.Status.HostIP, kubenode.CheckpointRequest{
		Namespace: k.cfg.Namespace, Pod: name, PodUID: p.Metadata.UID, Name: ckpt,
	})
	if err != nil {
		k.unpause(context.WithoutCancel(ctx), p, networked)
		return nil, fmt.Errorf("sandbox %s: checkpoint on node %s: %w", id, p.Spec.NodeName, err)
	}
	k.remember(id, nil)
	if err := k.c.DeletePod(context.WithoutCancel(ctx), k.cfg.Namespace, name, 0); err != nil {
		return nil, fmt.Errorf("sandbox %s: checkpointed, but its pod stays: %w", id, err)
	}
	return res, nil
}

// unpause undoes a pause that did not checkpoint: the record goes, the
// Secret is the pod's again.
func (k *Placement) unpause(ctx context.Context, p *kube.Pod, networked bool) {
	// Best effort: the sweep removes a sandbox that ended.
	_ = k.dropRecord(ctx, p, networked)
	_, _ = k.c.PatchPodAnnotations(ctx, k.cfg.Namespace, p.Metadata.Name, map[string]*string{kubeAnnPausing: nil})
}

// dropRecord ends pod p's sandbox's paused record: the Secret of a
// sandbox with network is p's again (its owner, no longer labelled
// paused); one without network had no Secret but the record.
func (k *Placement) dropRecord(ctx context.Context, p *kube.Pod, networked bool) error {
	name := p.Metadata.Name
	if !networked {
		return k.c.DeleteSecret(ctx, k.cfg.Namespace, name)
	}
	return k.c.PatchSecret(ctx, k.cfg.Namespace, name, map[string]any{
		"metadata": map[string]any{
			"labels":          map[string]any{kubeLabelPaused: nil},
			"annotations":     map[string]any{kubeAnnCheckpoint: nil, kubeAnnNode: nil, kubeAnnHostIP: nil},
			"ownerReferences": []kube.OwnerRef{{APIVersion: "v1", Kind: "Pod", Name: name, UID: p.Metadata.UID}},
		},
		"data": map[string]any{kubePausedPodKey: nil},
	})
}

// Resume makes paused sandbox id's pod again on the node holding its
// checkpoint, restored from it, and waits until it runs. A resume that
// fails leaves the sandbox paused.
func (k *Placement) Resume(ctx context.Context, id string) (*engine.Sandbox, error) {
	if k.cfg.Nodes == nil {
		return nil, errNoNodeService
	}
	sec, err := k.pausedRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	if sec == nil {
		return nil, fmt.Errorf("sandbox %s is not paused: %w", id, errdefs.ErrConflict)
	}
	sb, p := pausedSandbox(sec)
	if sb == nil {
		return nil, fmt.Errorf("sandbox %s: its paused record %s is unreadable: %w", id, sec.Metadata.Name, errdefs.ErrFailedPrecondition)
	}
	a := sec.Metadata.Annotations
	ckpt, node, hostIP := a[kubeAnnCheckpoint], a[kubeAnnNode], a[kubeAnnHostIP]
	if !placement.ValidID(ckpt) || node == "" || hostIP == "" {
		return nil, fmt.Errorf("sandbox %s: its paused record names no checkpoint: %w", id, errdefs.ErrFailedPrecondition)
	}
	name := kubePodName(id)
	p.Metadata.Annotations[kubeShimRestore] = ckpt
	p.Spec.NodeName = node
	// The pod of the pause may still be going.
	var created *kube.Pod
	for wait := time.Now().Add(k.cfg.StartTimeout); ; {
		created, err = k.c.CreatePod(ctx, k.cfg.Namespace, p)
		if !errdefs.IsAlreadyExists(err) || time.Now().After(wait) {
			break
		}
		if old, gerr := k.c.GetPod(ctx, k.cfg.Namespace, name); gerr == nil && old.Metadata.Annotations[kubeShimRestore] == ckpt {
			// Another server's resume of the same sandbox made it.
			created, err = old, nil
			break
		}
		k.c.DeletePod(ctx, k.cfg.Namespace, name, 0) //nolint:errcheck // the create's retry says
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: make its pod again: %w", id, err)
	}
	running, err := k.waitRunning(ctx, name)
	if err != nil {
		k.c.DeletePod(context.WithoutCancel(ctx), k.cfg.Namespace, name, 0) //nolint:errcheck // best effort; the sandbox stays paused
		return nil, fmt.Errorf("sandbox %s: restore on node %s: %w", id, node, err)
	}
	networked := !podOnAPIExec(running)
	// Running: the record goes; the Secret is the new pod's.
	if err := k.dropRecord(ctx, created, networked); err != nil {
		return nil, fmt.Errorf("sandbox %s: resumed, but its record stays: %w", id, err)
	}
	if err := k.cfg.Nodes.Remove(ctx, hostIP, kubenode.RemoveRequest{Namespace: k.cfg.Namespace, Name: ckpt}); err != nil {
		// The sandbox runs; only the node's disk keeps the checkpoint.
		return nil, fmt.Errorf("sandbox %s: resumed, but its checkpoint on node %s stays: %w", id, node, err)
	}
	if networked && running.Status.PodIP != "" {
		if key, err := hex.DecodeString(string(sec.Data[kubeAgentSecretKey])); err == nil && len(key) == agentnet.KeySize {
			k.remember(id, &kubeEndpoint{addr: net.JoinHostPort(running.Status.PodIP, strconv.Itoa(agentnet.Port)), key: key})
		}
	}
	sb = podSandbox(running)
	if d, err := time.ParseDuration(running.Metadata.Annotations[kubeAnnTimeout]); err == nil && d > 0 {
		// Its life counts from now again.
		return k.SetTimeout(ctx, id, d)
	}
	return sb, nil
}

// removePaused deletes paused sandbox id: its checkpoint on its node,
// then its record.
func (k *Placement) removePaused(ctx context.Context, sec *kube.Secret) error {
	a := sec.Metadata.Annotations
	if k.cfg.Nodes != nil && placement.ValidID(a[kubeAnnCheckpoint]) && a[kubeAnnHostIP] != "" {
		if err := k.cfg.Nodes.Remove(ctx, a[kubeAnnHostIP], kubenode.RemoveRequest{Namespace: k.cfg.Namespace, Name: a[kubeAnnCheckpoint]}); err != nil {
			return fmt.Errorf("sandbox %s: its checkpoint on node %s: %w", sec.Metadata.Labels[kubeLabelID], a[kubeAnnNode], err)
		}
	}
	if err := k.c.DeletePod(ctx, k.cfg.Namespace, sec.Metadata.Name, 0); err != nil {
		return err
	}
	return k.c.DeleteSecret(ctx, k.cfg.Namespace, sec.Metadata.Name)
}

// kubePauseAbandoned is how long a pause may run before the sweep takes
// it for one its server abandoned (beyond the node service's own bound).
const kubePauseAbandoned = 15 * time.Minute

// kubeLeftovers is what a server that died mid-operation left among pods
// and secrets (all of the server's): Secrets of sandboxes whose pod was
// never made (no owner, no record, older than twice the start timeout),
// pods of paused sandboxes that their pause did not delete (no longer
// running), and pauses that never finished (still running long after).
func kubeLeftovers(pods []kube.Pod, secrets []kube.Secret, now time.Time, startTimeout time.Duration) (secretsGone, podsGone []string, undo []*kube.Pod) {
	podByName := map[string]*kube.Pod{}
	for i := range pods {
		podByName[pods[i].Metadata.Name] = &pods[i]
	}
	paused := map[string]bool{}
	for _, sec := range secrets {
		l := sec.Metadata.Labels
		if l[kubeLabelManaged] != kubeManagedBy {
			continue
		}
		if l[kubeLabelPaused] == "true" {
			paused[sec.Metadata.Name] = true
			continue
		}
		if l[kubeLabelKind] != "" || len(sec.Metadata.OwnerReferences) > 0 || sec.Metadata.CreationTimestamp == nil ||
			now.Sub(*sec.Metadata.CreationTimestamp) < 2*startTimeout {
			continue
		}
		if _, ok := podByName[sec.Metadata.Name]; !ok {
			secretsGone = append(secretsGone, sec.Metadata.Name)
		}
	}
	for i := range pods {
		p := &pods[i]
		since := p.Metadata.Annotations[kubeAnnPausing]
		if since == "" || !paused[p.Metadata.Name] || p.Metadata.DeletionTimestamp != nil {
			continue
		}
		if !p.Running(kubeContainer) {
			podsGone = append(podsGone, p.Metadata.Name)
			continue
		}
		if t, err := time.Parse(time.RFC3339Nano, since); err != nil || now.Sub(t) > kubePauseAbandoned {
			undo = append(undo, p)
		}
	}
	return secretsGone, podsGone, undo
}

// sweepLeftovers removes kubeLeftovers.
func (k *Placement) sweepLeftovers(ctx context.Context) error {
	pods, err := k.c.ListPods(ctx, k.cfg.Namespace, k.selector(""))
	if err != nil {
		return err
	}
	secrets, err := k.c.ListSecrets(ctx, k.cfg.Namespace, k.selector(""))
	if err != nil {
		return err
	}
	secretsGone, podsGone, undo := kubeLeftovers(pods, secrets, time.Now(), k.cfg.StartTimeout)
	for _, name := range secretsGone {
		if err := k.c.DeleteSecret(ctx, k.cfg.Namespace, name); err != nil {
			return err
		}
		k.log.Info("removed a sandbox's key whose pod was never made", "secret", name)
	}
	for _, name := range podsGone {
		if err := k.c.DeletePod(ctx, k.cfg.Namespace, name, 0); err != nil {
			return err
		}
		k.log.Info("removed the pod of a paused sandbox", "pod", name)
	}
	for _, p := range undo {
		k.unpause(ctx, p, !podOnAPIExec(p))
		k.log.Warn("a pause never finished; the sandbox runs on", "pod", p.Metadata.Name)
	}
	return nil
}
