package kubeplace

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/agent/agentnet"
	"hutch.dev/hutch/agent/wire"
	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/kubenode"
	"hutch.dev/hutch/policy"
	"hutch.dev/hutch/serve/kube"
	"hutch.dev/hutch/serve/placement"
	"hutch.dev/hutch/serve/tenant"
)

// Config places sandboxes on a Kubernetes cluster.
type Config struct {
	// Client is the cluster's API server.
	Client *kube.Client
	// Namespace holds the server's pods.
	Namespace string
	// RuntimeClass is the pods' runtimeClassName (hutch's, "hutch").
	RuntimeClass string
	// Templates maps E2B templateIDs to image references the nodes can
	// pull (or have).
	Templates map[string]string
	// Starts are the start commands and ready checks of templates (by
	// templateID) whose pods start cold with them: a create starts the
	// command in the new pod and answers once the check passes.
	Starts map[string]*engine.Template
	// PullPolicy is the containers' imagePullPolicy; empty: IfNotPresent.
	PullPolicy string
	// StartTimeout bounds how long a create waits for its pod to run;
	// zero: two minutes.
	StartTimeout time.Duration
	// CPUs and Memory are each pod's requests and limits (equal: the
	// pods are Guaranteed); zero: hutch's defaults for a sandbox.
	CPUs   float64
	Memory int64
	// Nodes reaches hutch's node service on each node, which pause and
	// resume need (pause.go); nil: they answer 501.
	Nodes *kubenode.Client
}

// Names of what the server keeps on its pods.
const (
	kubeContainer = "sandbox"
	kubePodPrefix = "hutch-"
	// kubeManagedBy marks the server's pods (app.kubernetes.io/managed-by).
	kubeManagedBy    = "hutch-serve"
	kubeLabelManaged = "app.kubernetes.io/managed-by"
	kubeLabelID      = "hutch.dev/sandbox"
	kubeLabelTenant  = "hutch.dev/tenant"
	kubeAnnTemplate  = "hutch.dev/template"
	kubeAnnMetadata  = "hutch.dev/metadata"
	kubeAnnDeadline  = "hutch.dev/deadline"
	kubeAnnTimeout   = "hutch.dev/timeout"
	kubeAnnPrivate   = "hutch.dev/private-traffic"
	// kubeAnnAutoResume: a request without a key may resume the sandbox.
	kubeAnnAutoResume = "hutch.dev/auto-resume"
	kubeAnnNetwork    = "hutch.dev/network"
	// kubeAnnTokenGeneration is the generation of the sandbox's tokens
	// (placement.LabelTokenGeneration).
	kubeAnnTokenGeneration = "hutch.dev/token-generation"
	// kubeShimNetwork is the shim's annotation of a pod's network mode:
	// none takes the pod off the pod network.
	kubeShimNetwork = "dev.hutch.network"
	// kubeShimEgress holds a pod that keeps the pod network to the egress
	// a local sandbox with network open has, enforced by the shim on the
	// node: no other pod, no private or metadata address, no node.
	kubeShimEgress = "dev.hutch.egress"
	// kubeShimCPUs and kubeShimMemory are the shim's annotations of the
	// sandbox's own limits, inside the pod's cgroup: the same as the
	// pod's, which they must not exceed.
	kubeShimCPUs   = "dev.hutch.cpus"
	kubeShimMemory = "dev.hutch.memory"
	// kubeShimDisk is the shim's annotation bounding the writable layer;
	// without it, the shim's default (hutch's, unless the node's ceiling
	// is lower).
	kubeShimDisk = "dev.hutch.disk"
	// kubeAgentListen is the agent's mode as the init of a pod with a
	// network endpoint.
	kubeAgentListen = wire.ModeListen
)

// kubeSweepInterval is how often a server on Kubernetes deletes the pods
// whose deadline passed.
const kubeSweepInterval = 2 * time.Second

var kubeTemplateRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,127}$`)

// checkConfig validates kc and fills its defaults.
func checkConfig(kc *Config) error {
	if kc.Client == nil {
		return fmt.Errorf("kubernetes placement: no client: %w", errdefs.ErrInvalidArgument)
	}
	if kc.Namespace == "" {
		kc.Namespace = "default"
	}
	if kc.RuntimeClass == "" {
		kc.RuntimeClass = "hutch"
	}
	if len(kc.Templates) == 0 {
		return fmt.Errorf("kubernetes placement: no templates: map at least one templateID to an image: %w", errdefs.ErrInvalidArgument)
	}
	for t, img := range kc.Templates {
		if !kubeTemplateRE.MatchString(t) || img == "" {
			return fmt.Errorf("kubernetes template %q=%q: want NAME=IMAGE with a name of [a-z0-9._-]: %w", t, img, errdefs.ErrInvalidArgument)
		}
	}
	switch kc.PullPolicy {
	case "":
		kc.PullPolicy = "IfNotPresent"
	case "Always", "IfNotPresent", "Never":
	default:
		return fmt.Errorf("image pull policy %q: want Always, IfNotPresent or Never: %w", kc.PullPolicy, errdefs.ErrInvalidArgument)
	}
	if kc.CPUs < 0 || kc.Memory < 0 {
		return fmt.Errorf("kubernetes pods: negative CPUs or memory: %w", errdefs.ErrInvalidArgument)
	}
	if kc.CPUs == 0 {
		kc.CPUs = policy.DefaultCPUs
	}
	if kc.Memory == 0 {
		kc.Memory = policy.DefaultMemory
	}
	if kc.StartTimeout <= 0 {
		kc.StartTimeout = 2 * time.Minute
	}
	return nil
}

// Placement places the server's sandboxes on a Kubernetes cluster.
type Placement struct {
	cfg *Config
	c   *kube.Client
	log *slog.Logger
	// locks serializes pauses, forks and snapshots of a sandbox with its
	// resumes: the server's locks.
	locks *placement.Locks

	// epMu guards eps: how to reach each sandbox's agent, by ID.
	epMu sync.Mutex
	eps  map[string]*kubeEndpoint

	// leftoversSwept is when kubeSweepLeftovers last ran (Unix ns).
	leftoversSwept atomic.Int64
}

var _ placement.Placement = (*Placement)(nil)

// New places sandboxes as cfg says, after checking it and filling its
// defaults; locks are the server's per-sandbox locks, which its resumes
// take.
func New(cfg *Config, log *slog.Logger, locks *placement.Locks) (*Placement, error) {
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	return &Placement{cfg: cfg, c: cfg.Client, log: log, locks: locks}, nil
}

// kubeLeftoverInterval is how often the sweep looks for what a server
// that died mid-operation left.
const kubeLeftoverInterval = 30 * time.Second

func (k *Placement) selector(tenantName string) string {
	sel := kubeLabelManaged + "=" + kubeManagedBy
	if tenantName != "" {
		sel += "," + kubeLabelTenant + "=" + tenantName
	}
	return sel
}

// List is the server's sandboxes, of tenant (all tenants': ""): the API
// server selects by tenant, so nothing of another tenant's pods comes
// back.
func (k *Placement) List(ctx context.Context, tenantName string) ([]*engine.Sandbox, error) {
	pods, err := k.c.ListPods(ctx, k.cfg.Namespace, k.selector(tenantName))
	if err != nil {
		return nil, err
	}
	recs, err := k.c.ListSecrets(ctx, k.cfg.Namespace, k.selector(tenantName)+","+kubeLabelPaused+"=true")
	if err != nil {
		return nil, err
	}
	paused := map[string]*engine.Sandbox{}
	for i := range recs {
		if sb, _ := pausedSandbox(&recs[i]); sb != nil {
			paused[sb.ID] = sb
		}
	}
	var out []*engine.Sandbox
	for i := range pods {
		if pods[i].Metadata.DeletionTimestamp != nil {
			// Being deleted: gone for the API.
			continue
		}
		sb := podSandbox(&pods[i])
		if sb == nil {
			continue
		}
		if _, ok := paused[sb.ID]; ok {
			if sb.State != engine.StateRunning || pods[i].Metadata.Annotations[kubeAnnPausing] != "" {
				// Being paused, or being resumed and not yet running.
				continue
			}
			// Resumed: running again, its record about to go.
			delete(paused, sb.ID)
		}
		out = append(out, sb)
	}
	for _, sb := range paused {
		out = append(out, sb)
	}
	slices.SortFunc(out, func(a, b *engine.Sandbox) int { return a.Created.Compare(b.Created) })
	return out, nil
}

// Get is sandbox id, running as a pod or paused; ErrNotFound if the
// server has neither.
func (k *Placement) Get(ctx context.Context, id string) (*engine.Sandbox, error) {
	p, err := k.c.GetPod(ctx, k.cfg.Namespace, kubePodName(id))
	if err != nil && !errdefs.IsNotFound(err) {
		return nil, err
	}
	var sb *engine.Sandbox
	if err == nil && p.Metadata.DeletionTimestamp == nil {
		if sb = podSandbox(p); sb != nil && sb.ID != id {
			sb = nil
		}
		if sb != nil && sb.State == engine.StateRunning && p.Metadata.Annotations[kubeAnnPausing] == "" {
			return sb, nil
		}
	}
	// No pod, or one that does not run: the sandbox may be paused.
	rec, err := k.pausedRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	if rec != nil {
		if psb, _ := pausedSandbox(rec); psb != nil && psb.ID == id {
			return psb, nil
		}
	}
	if sb == nil {
		return nil, fmt.Errorf("sandbox %q not found: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

// Remove deletes sandbox id's pod and Secret, or its checkpoint and
// record if it is paused.
func (k *Placement) Remove(ctx context.Context, id string) error {
	k.remember(id, nil)
	rec, err := k.pausedRecord(ctx, id)
	if err != nil {
		return err
	}
	if rec != nil {
		return k.removePaused(ctx, rec)
	}
	if err := k.c.DeletePod(ctx, k.cfg.Namespace, kubePodName(id), 1); err != nil {
		return err
	}
	// The cluster deletes it with the pod too (its owner).
	return k.c.DeleteSecret(ctx, k.cfg.Namespace, kubePodName(id))
}

// SetTimeout gives sandbox id d more to live from now (0: no deadline).
func (k *Placement) SetTimeout(ctx context.Context, id string, d time.Duration) (*engine.Sandbox, error) {
	set := map[string]*string{kubeAnnDeadline: nil, kubeAnnTimeout: nil}
	if d > 0 {
		dl, ts := time.Now().Add(d).UTC().Format(time.RFC3339Nano), d.String()
		set[kubeAnnDeadline], set[kubeAnnTimeout] = &dl, &ts
	}
	p, err := k.c.PatchPodAnnotations(ctx, k.cfg.Namespace, kubePodName(id), set)
	if err != nil {
		return nil, err
	}
	sb := podSandbox(p)
	if sb == nil {
		return nil, fmt.Errorf("sandbox %q not found: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

// SetTokenGeneration keeps the generation in an annotation of the
// sandbox's pod or, while it is paused, of the pod its record holds,
// which its resume makes again. The server holds the sandbox's lock,
// which pauses take too.
func (k *Placement) SetTokenGeneration(ctx context.Context, id string, gen uint64) (*engine.Sandbox, error) {
	g := strconv.FormatUint(gen, 10)
	rec, err := k.pausedRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		p, err := k.c.PatchPodAnnotations(ctx, k.cfg.Namespace, kubePodName(id), map[string]*string{kubeAnnTokenGeneration: &g})
		if err != nil {
			return nil, err
		}
		sb := podSandbox(p)
		if sb == nil {
			return nil, fmt.Errorf("sandbox %q not found: %w", id, errdefs.ErrNotFound)
		}
		return sb, nil
	}
	sb, p := pausedSandbox(rec)
	if sb == nil {
		return nil, fmt.Errorf("sandbox %s: its paused record %s is unreadable: %w", id, rec.Metadata.Name, errdefs.ErrFailedPrecondition)
	}
	p.Metadata.Annotations[kubeAnnTokenGeneration] = g
	podJSON, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	if err := k.c.PatchSecret(ctx, k.cfg.Namespace, rec.Metadata.Name, map[string]any{"data": map[string][]byte{kubePausedPodKey: podJSON}}); err != nil {
		return nil, fmt.Errorf("sandbox %s: record its token generation: %w", id, err)
	}
	sb.Labels[placement.LabelTokenGeneration] = g
	return sb, nil
}

// create makes sb's pod and waits until it runs; a pod that does not
// run in time (an image that cannot be pulled, a node that refuses it)
// is deleted, with the kubelet's reason in the error.
func (k *Placement) create(ctx context.Context, req kubeSandbox) (*engine.Sandbox, error) {
	req.AgentKey = req.Network != "none"
	pod, err := renderPod(k.cfg, req)
	if err != nil {
		return nil, err
	}
	var key string
	if req.Restore != nil {
		// On the checkpoint's node, its agent holding the key it had.
		pod.Spec.NodeName = req.Restore.Node
		pod.Metadata.Annotations[kubeShimRestore] = req.Restore.Checkpoint
		if req.AgentKey && req.Restore.Key == "" {
			return nil, fmt.Errorf("sandbox %s: the snapshot holds no agent key: %w", req.ID, errdefs.ErrFailedPrecondition)
		}
	}
	if req.AgentKey {
		// The Secret first: the kubelet needs it to start the pod.
		key = newAgentKey()
		if req.Restore != nil {
			key = req.Restore.Key
		}
		if err := k.c.CreateSecret(ctx, k.cfg.Namespace, k.agentSecret(req.ID, req.Tenant, key)); err != nil {
			return nil, fmt.Errorf("sandbox %s: the agent's key: %w", req.ID, err)
		}
	}
	ok := false
	defer func() {
		if !ok && req.AgentKey {
			k.c.DeleteSecret(context.WithoutCancel(ctx), k.cfg.Namespace, pod.Metadata.Name) //nolint:errcheck // best effort: owned by the pod if it was made
		}
	}()
	created, err := k.c.CreatePod(ctx, k.cfg.Namespace, pod)
	if err != nil {
		return nil, err
	}
	defer func() {
		if !ok {
			k.c.DeletePod(context.WithoutCancel(ctx), k.cfg.Namespace, pod.Metadata.Name, 0) //nolint:errcheck // best effort: the sweep deletes what is left
		}
	}()
	if req.AgentKey {
		if err := k.c.SetSecretOwner(ctx, k.cfg.Namespace, pod.Metadata.Name, created); err != nil {
			return nil, fmt.Errorf("sandbox %s: the agent's key: %w", req.ID, err)
		}
	}
	p, err := k.waitRunning(ctx, pod.Metadata.Name)
	if err != nil {
		return nil, err
	}
	sb := podSandbox(p)
	if req.AgentKey && p.Status.PodIP != "" {
		kb, _ := hex.DecodeString(key)
		k.remember(req.ID, &kubeEndpoint{addr: net.JoinHostPort(p.Status.PodIP, strconv.Itoa(agentnet.Port)), key: kb})
	}
	if req.Timeout > 0 {
		// Its life counts from now, as a sandbox's on a host from the
		// end of its create.
		if sb, err = k.SetTimeout(ctx, req.ID, req.Timeout); err != nil {
			return nil, err
		}
	}
	ok = true
	return sb, nil
}

// waitRunning waits until pod name's container runs; a pod that does not
// run in time (an image that cannot be pulled, a node that refuses it)
// is an error with the kubelet's reason.
func (k *Placement) waitRunning(ctx context.Context, name string) (*kube.Pod, error) {
	deadline := time.Now().Add(k.cfg.StartTimeout)
	why := "not scheduled yet"
	var lastEvents time.Time
	for {
		p, err := k.c.GetPod(ctx, k.cfg.Namespace, name)
		if err != nil {
			return nil, err
		}
		if p.Running(kubeContainer) {
			return p, nil
		}
		if p.Metadata.Annotations[kubeShimRestore] != "" && p.Status.Phase == "Pending" && time.Since(lastEvents) > time.Second {
			// A sandbox restored from a checkpoint that the shim cannot
			// restore never will be: the kubelet would retry it until
			// the start timeout.
			lastEvents = time.Now()
			if msg := k.sandboxFailed(ctx, p); msg != "" {
				return nil, fmt.Errorf("sandbox pod %s cannot be restored: %s: %w", name, msg, errdefs.ErrFailedPrecondition)
			}
		}
		if p.Status.Phase == "Failed" || p.Status.Phase == "Succeeded" {
			return nil, fmt.Errorf("sandbox pod %s ended at start (%s): %s: %w", name, p.Status.Phase, p.Status.Message, errdefs.ErrUnavailable)
		}
		if reason, msg := p.Waiting(kubeContainer); reason != "" {
			why = reason + ": " + msg
			switch reason {
			case "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError", "CreateContainerError", "RunContainerError":
				return nil, fmt.Errorf("sandbox pod %s cannot start: %s: %w", name, why, errdefs.ErrFailedPrecondition)
			}
		} else if msg := p.Unschedulable(); msg != "" {
			why = "unschedulable: " + msg
		} else if p.Status.Phase != "" {
			why = "pod " + p.Status.Phase
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("sandbox pod %s did not run within %s (%s): %w", name, k.cfg.StartTimeout, why, errdefs.ErrUnavailable)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// sandboxFailed is the kubelet's message when it failed to make pod p's
// sandbox ("" if it did not, or the server may not read events).
func (k *Placement) sandboxFailed(ctx context.Context, p *kube.Pod) string {
	evs, err := k.c.PodEvents(ctx, k.cfg.Namespace, p.Metadata.Name)
	if err != nil {
		return ""
	}
	for _, e := range evs {
		if e.InvolvedObject.UID == p.Metadata.UID && e.Reason == "FailedCreatePodSandBox" {
			return e.Message
		}
	}
	return ""
}

// kubeCreate is a create the placement checked: the pod to make.
type kubeCreate struct {
	ks kubeSandbox
	// start is the template's start command, for a pod of its image
	// (not of a snapshot, whose processes carry on).
	start *engine.Template
}

func (c kubeCreate) Usage() tenant.Usage {
	return placement.UsageOf(c.ks.CPUs, c.ks.Memory, 0)
}

// Prepare resolves the template, one of the server's (Config.Templates)
// or one of the tenant's snapshots, and checks what a pod takes.
func (k *Placement) Prepare(ctx context.Context, req placement.CreateRequest) (placement.Prepared, error) {
	image, ok := k.cfg.Templates[req.TemplateID]
	var snap *kube.Secret
	if !ok {
		var err error
		if snap, err = k.snapshotRecord(ctx, req.Tenant, req.TemplateID); err != nil {
			return nil, err
		}
		if snap == nil {
			return nil, fmt.Errorf("template %q not found: this server places sandboxes on Kubernetes from templates %s and the tenant's snapshots: %w",
				req.TemplateID, strings.Join(slices.Sorted(maps.Keys(k.cfg.Templates)), ", "), errdefs.ErrNotFound)
		}
	}
	for name := range req.Env {
		if name == "" || strings.ContainsAny(name, "=\x00") {
			return nil, fmt.Errorf("envVars %q: not a variable name: %w", name, errdefs.ErrInvalidArgument)
		}
		if name == agentnet.EnvKey {
			return nil, fmt.Errorf("envVars %q: reserved for hutch's agent: %w", name, errdefs.ErrInvalidArgument)
		}
	}
	ks := kubeSandbox{
		ID: kubeNewID(), Tenant: req.Tenant, Template: req.TemplateID, Image: image,
		Metadata: req.Metadata, Env: req.Env, CPUs: k.cfg.CPUs, Memory: k.cfg.Memory,
		Network: req.Network, Timeout: req.Timeout, Now: time.Now(), Private: req.Private,
		AutoResume: req.AutoResume,
	}
	if snap != nil {
		// The snapshot's processes carry on: its image, environment,
		// limits and network are the sandbox's it was made of.
		if len(req.Env) > 0 {
			return nil, fmt.Errorf("envVars: a sandbox made from snapshot %q on Kubernetes placement carries on the snapshot's processes with their environment; give none: %w", req.TemplateID, errdefs.ErrInvalidArgument)
		}
		if err := fromSnapshot(&ks, snap); err != nil {
			return nil, err
		}
		if req.NetworkGiven && req.Network != ks.Network {
			return nil, fmt.Errorf("network %s: snapshot %q has network %s, which a sandbox made from it keeps: %w", req.Network, req.TemplateID, ks.Network, errdefs.ErrInvalidArgument)
		}
	}
	if snap != nil {
		return kubeCreate{ks: ks}, nil
	}
	return kubeCreate{ks: ks, start: k.cfg.Starts[req.TemplateID]}, nil
}

// Create makes the sandbox's pod and waits until it runs.
func (k *Placement) Create(ctx context.Context, p placement.Prepared) (*engine.Sandbox, error) {
	c, ok := p.(kubeCreate)
	if !ok {
		return nil, fmt.Errorf("create: not prepared by this backend: %w", errdefs.ErrInvalidArgument)
	}
	start := time.Now()
	sb, err := k.create(ctx, c.ks)
	if err != nil {
		return nil, err
	}
	k.log.Debug("pod created", "sandbox", sb.ID, "tenant", c.ks.Tenant, "pod", kubePodName(sb.ID), "duration", time.Since(start))
	if c.start != nil {
		if err := k.startTemplate(ctx, sb.ID, c.start); err != nil {
			if rerr := k.Remove(context.WithoutCancel(ctx), sb.ID); rerr != nil {
				k.log.Warn("delete the pod of a template that did not get ready", "sandbox", sb.ID, "err", rerr)
			}
			return nil, fmt.Errorf("template %s: %w", c.ks.Template, err)
		}
		k.log.Debug("template ready", "sandbox", sb.ID, "duration", time.Since(start))
	}
	return sb, nil
}

// Recover deletes the server's pods whose deadline passed or that ended,
// and what a server that died mid-operation left. A pod is not looked
// at twice: the cluster's state is the truth.
func (k *Placement) Recover(ctx context.Context, _ time.Duration, forget func(id string)) (int, error) {
	all, err := k.List(ctx, "")
	if err != nil {
		return 0, err
	}
	n := 0
	now := time.Now()
	for _, sb := range all {
		// A pod being created gets its deadline anew once it runs.
		expired := sb.Deadline != nil && now.After(*sb.Deadline) && sb.State != engine.StateCreating
		// A pod still not running long after its create gave up was
		// left by a server that died mid-create.
		stuck := sb.State == engine.StateCreating && now.Sub(sb.Created) > 2*k.cfg.StartTimeout
		if !expired && !stuck && sb.State != engine.StateStopped {
			continue
		}
		forget(sb.ID)
		if err := k.Remove(ctx, sb.ID); err != nil {
			k.log.Warn("delete sandbox pod", "sandbox", sb.ID, "err", err)
			continue
		}
		n++
		k.log.Info("removed sandbox", "sandbox", sb.ID, "tenant", sb.Labels[placement.LabelTenant], "expired", expired, "state", sb.State)
	}
	if last := k.leftoversSwept.Load(); now.UnixNano()-last < int64(kubeLeftoverInterval) {
		return n, nil
	}
	k.leftoversSwept.Store(now.UnixNano())
	return n, k.sweepLeftovers(ctx)
}

// SweepInterval is kubeSweepInterval: deadlines are kept by the sweep.
func (k *Placement) SweepInterval() time.Duration { return kubeSweepInterval }
