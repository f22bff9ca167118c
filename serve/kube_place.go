package serve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/agent/agentnet"
	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/kubenode"
	"hutch.dev/hutch/policy"
	"hutch.dev/hutch/serve/kube"
)

// Kubernetes placement: with Config.Kube the server runs no sandbox
// itself. Each sandbox is a pod with the hutch RuntimeClass (gVisor through
// hutch's shim on whichever node the cluster's scheduler picks), whose one
// container runs the agent (hutch-init, which the shim mounts into every
// pod) as its init. Everything the server knows of a sandbox is on its
// pod, in labels (what selects: manager, tenant, sandbox ID) and
// annotations (template, metadata, deadline), and its agent's key in a
// Secret the pod owns: a restarted server, or another one on the same
// namespace, finds every sandbox again. Commands and files reach a
// sandbox through its agent's authenticated endpoint on the pod network
// (kube_agent.go), or the pods/exec subresource for a sandbox without
// network, running the same agent modes the engine runs through runsc
// exec.

// KubeConfig places sandboxes on a Kubernetes cluster.
type KubeConfig struct {
	// Client is the cluster's API server.
	Client *kube.Client
	// Namespace holds the server's pods.
	Namespace string
	// RuntimeClass is the pods' runtimeClassName (hutch's, "hutch").
	RuntimeClass string
	// Templates maps E2B templateIDs to image references the nodes can
	// pull (or have).
	Templates map[string]string
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
	// resume need (kube_pause.go); nil: they answer 501.
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
	kubeAnnNetwork   = "hutch.dev/network"
	// kubeShimNetwork is the shim's annotation of a pod's network mode:
	// none takes the pod off the pod network.
	kubeShimNetwork = "dev.hutch.network"
	// kubeShimCPUs and kubeShimMemory are the shim's annotations of the
	// sandbox's own limits, inside the pod's cgroup: the same as the
	// pod's, which they must not exceed.
	kubeShimCPUs   = "dev.hutch.cpus"
	kubeShimMemory = "dev.hutch.memory"
	// kubeAgentListen is the agent's mode as the init of a pod with a
	// network endpoint.
	kubeAgentListen = "listen"
)

// kubeSweepInterval is how often a server on Kubernetes deletes the pods
// whose deadline passed.
const kubeSweepInterval = 2 * time.Second

var kubeTemplateRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,127}$`)

// checkKube validates kc and fills its defaults.
func checkKube(kc *KubeConfig) error {
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

func kubePodName(id string) string { return kubePodPrefix + id }

// kubeNewID is a new sandbox ID: 32 random hex digits, as the engine's.
func kubeNewID() string {
	var b [16]byte
	rand.Read(b[:]) //nolint:errcheck // never fails
	return hex.EncodeToString(b[:])
}

// kubeSandbox is what a create asks of a pod.
type kubeSandbox struct {
	ID, Tenant, Template, Image string
	Metadata                    map[string]string
	Env                         map[string]string
	CPUs                        float64
	Memory                      int64
	// Network is none or open.
	Network string
	Private bool
	// AgentKey is the Secret (the pod's name) holding the agent's key;
	// false for a sandbox without network.
	AgentKey bool
	// Timeout is the sandbox's life from now; zero: no deadline.
	Timeout time.Duration
	Now     time.Time
	// Restore, if set, makes the pod on the node holding a snapshot's
	// checkpoint, restored from it.
	Restore *kubeRestore
}

// renderPod is the pod of a sandbox: one container running the agent as
// its init, with equal requests and limits, no service account token and
// no service links (nothing of the cluster inside a tenant's sandbox).
func renderPod(kc *KubeConfig, sb kubeSandbox) (*kube.Pod, error) {
	meta, err := json.Marshal(sb.Metadata)
	if err != nil {
		return nil, err
	}
	no := false
	grace := int64(1)
	res := map[string]string{
		"cpu":    strconv.FormatInt(int64(sb.CPUs*1000+0.5), 10) + "m",
		"memory": strconv.FormatInt(sb.Memory, 10),
	}
	p := &kube.Pod{
		APIVersion: "v1", Kind: "Pod",
		Metadata: kube.Meta{
			Name: kubePodName(sb.ID), Namespace: kc.Namespace,
			Labels: map[string]string{kubeLabelManaged: kubeManagedBy, kubeLabelID: sb.ID, kubeLabelTenant: sb.Tenant},
			Annotations: map[string]string{
				kubeAnnTemplate: sb.Template, kubeAnnMetadata: string(meta), kubeAnnNetwork: sb.Network,
				kubeShimCPUs:   strconv.FormatFloat(float64(int64(sb.CPUs*1000+0.5))/1000, 'f', -1, 64),
				kubeShimMemory: strconv.FormatInt(sb.Memory, 10),
			},
		},
		Spec: kube.PodSpec{
			RuntimeClassName: kc.RuntimeClass, RestartPolicy: "Never",
			AutomountServiceAccountToken: &no, EnableServiceLinks: &no,
			TerminationGracePeriodSeconds: &grace,
			Containers: []kube.Container{{
				Name: kubeContainer, Image: sb.Image, ImagePullPolicy: kc.PullPolicy,
				Command:   []string{engine.AgentPath},
				Resources: kube.Resources{Requests: res, Limits: maps.Clone(res)},
			}},
		},
	}
	for _, k := range slices.Sorted(maps.Keys(sb.Env)) {
		p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, kube.EnvVar{Name: k, Value: sb.Env[k]})
	}
	if sb.AgentKey {
		c := &p.Spec.Containers[0]
		c.Command = append(c.Command, kubeAgentListen)
		c.Env = append(c.Env, kube.EnvVar{Name: agentnet.EnvKey, ValueFrom: &kube.EnvSource{
			SecretKeyRef: &kube.KeyRef{Name: kubePodName(sb.ID), Key: kubeAgentSecretKey},
		}})
	}
	if sb.Network == "none" {
		p.Metadata.Annotations[kubeShimNetwork] = "none"
	}
	if sb.Private {
		p.Metadata.Annotations[kubeAnnPrivate] = "true"
	}
	if sb.Timeout > 0 {
		p.Metadata.Annotations[kubeAnnDeadline] = sb.Now.Add(sb.Timeout).UTC().Format(time.RFC3339Nano)
		p.Metadata.Annotations[kubeAnnTimeout] = sb.Timeout.String()
	}
	return p, nil
}

// podSandbox is a pod of the server as the API's handlers see a sandbox:
// the labels serve keeps on the engine's sandboxes, its state, limits
// and deadline. A pod that is not the server's is nil.
func podSandbox(p *kube.Pod) *engine.Sandbox {
	l := p.Metadata.Labels
	if l[kubeLabelManaged] != kubeManagedBy || !validID(l[kubeLabelID]) || l[kubeLabelTenant] == "" {
		return nil
	}
	a := p.Metadata.Annotations
	sb := &engine.Sandbox{
		ID: l[kubeLabelID], Network: a[kubeAnnNetwork], Timeout: a[kubeAnnTimeout],
		Labels: map[string]string{labelTenant: l[kubeLabelTenant], labelTemplate: a[kubeAnnTemplate]},
	}
	if len(p.Spec.Containers) > 0 {
		c := p.Spec.Containers[0]
		sb.Image = c.Image
		if v, ok := strings.CutSuffix(c.Resources.Limits["cpu"], "m"); ok {
			if m, err := strconv.ParseInt(v, 10, 64); err == nil {
				sb.CPUs = float64(m) / 1000
			}
		}
		sb.Memory, _ = strconv.ParseInt(c.Resources.Limits["memory"], 10, 64)
	}
	var meta map[string]string
	if json.Unmarshal([]byte(a[kubeAnnMetadata]), &meta) == nil {
		for k, v := range meta {
			sb.Labels[metaPrefix+k] = v
		}
	}
	if a[kubeAnnPrivate] == "true" {
		sb.Labels[labelPrivate] = "true"
	}
	if t, err := time.Parse(time.RFC3339Nano, a[kubeAnnCreated]); err == nil {
		// A resumed sandbox's pod is newer than the sandbox.
		sb.Created = t
	} else if p.Metadata.CreationTimestamp != nil {
		sb.Created = *p.Metadata.CreationTimestamp
	}
	if d, err := time.Parse(time.RFC3339Nano, a[kubeAnnDeadline]); err == nil {
		sb.Deadline = &d
	}
	switch {
	case p.Metadata.DeletionTimestamp != nil, p.Status.Phase == "Succeeded", p.Status.Phase == "Failed":
		sb.State = engine.StateStopped
	case p.Running(kubeContainer):
		sb.State = engine.StateRunning
	case p.Status.Phase == "Running":
		// Its container ended (or restarts): of no more use.
		sb.State = engine.StateStopped
	default:
		sb.State = engine.StateCreating
	}
	return sb
}

// kubePlacement is the server's Kubernetes placement.
type kubePlacement struct {
	cfg *KubeConfig
	c   *kube.Client

	// epMu guards eps: how to reach each sandbox's agent, by ID.
	epMu sync.Mutex
	eps  map[string]*kubeEndpoint

	// leftoversSwept is when kubeSweepLeftovers last ran (Unix ns).
	leftoversSwept atomic.Int64
}

// kubeLeftoverInterval is how often the sweep looks for what a server
// that died mid-operation left.
const kubeLeftoverInterval = 30 * time.Second

func (k *kubePlacement) selector(tenantName string) string {
	sel := kubeLabelManaged + "=" + kubeManagedBy
	if tenantName != "" {
		sel += "," + kubeLabelTenant + "=" + tenantName
	}
	return sel
}

// list is the server's sandboxes, of tenant (all tenants': "").
func (k *kubePlacement) list(ctx context.Context, tenantName string) ([]*engine.Sandbox, error) {
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

// get is sandbox id; ErrNotFound if the server has no such pod.
func (k *kubePlacement) get(ctx context.Context, id string) (*engine.Sandbox, error) {
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

func (k *kubePlacement) remove(ctx context.Context, id string) error {
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

// setTimeout gives sandbox id d more to live from now (0: no deadline).
func (k *kubePlacement) setTimeout(ctx context.Context, id string, d time.Duration) (*engine.Sandbox, error) {
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

// create makes sb's pod and waits until it runs; a pod that does not
// run in time (an image that cannot be pulled, a node that refuses it)
// is deleted, with the kubelet's reason in the error.
func (k *kubePlacement) create(ctx context.Context, req kubeSandbox) (*engine.Sandbox, error) {
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
		if sb, err = k.setTimeout(ctx, req.ID, req.Timeout); err != nil {
			return nil, err
		}
	}
	ok = true
	return sb, nil
}

// waitRunning waits until pod name's container runs; a pod that does not
// run in time (an image that cannot be pulled, a node that refuses it)
// is an error with the kubelet's reason.
func (k *kubePlacement) waitRunning(ctx context.Context, name string) (*kube.Pod, error) {
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
func (k *kubePlacement) sandboxFailed(ctx context.Context, p *kube.Pod) string {
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

// kubeCreate is POST /sandboxes on Kubernetes placement.
func (s *Server) kubeCreate(r *http.Request, tenantName string) (int, any, error) {
	var req newSandboxJSON
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	if req.TemplateID == "" {
		return 0, nil, fmt.Errorf("templateID: required: %w", errdefs.ErrInvalidArgument)
	}
	for name, m := range map[string]json.RawMessage{"mcp": req.MCP, "iam": req.IAM, "volumeMounts": req.VolumeMounts} {
		if !isNull(m) {
			return 0, nil, fmt.Errorf("%s is not supported when hutch serve places sandboxes on Kubernetes: %w", name, errdefs.ErrNotImplemented)
		}
	}
	if req.AutoPause != nil && *req.AutoPause {
		return 0, nil, fmt.Errorf("autoPause is not supported when hutch serve places sandboxes on Kubernetes (a sandbox ends at its timeout; pause it by the API): %w", errdefs.ErrNotImplemented)
	}
	timeout, err := checkTimeout(req.Timeout, defaultTimeout)
	if err != nil {
		return 0, nil, err
	}
	image, ok := s.kube.cfg.Templates[req.TemplateID]
	var snap *kube.Secret
	if !ok {
		if err := checkTemplateID(req.TemplateID); err != nil {
			return 0, nil, err
		}
		if snap, err = s.kube.snapshotRecord(r.Context(), tenantName, req.TemplateID); err != nil {
			return 0, nil, err
		}
		if snap == nil {
			return 0, nil, fmt.Errorf("template %q not found: this server places sandboxes on Kubernetes from templates %s and the tenant's snapshots: %w",
				req.TemplateID, strings.Join(slices.Sorted(maps.Keys(s.kube.cfg.Templates)), ", "), errdefs.ErrNotFound)
		}
	}
	mode, allow, err := s.networkPolicy(req.AllowInternetAccess, req.Network, s.cfg.DefaultNetwork)
	if err != nil {
		return 0, nil, err
	}
	if mode == "allow" || len(allow) > 0 {
		return 0, nil, fmt.Errorf("network allowOut lists are not supported when hutch serve places sandboxes on Kubernetes (the cluster's NetworkPolicies govern pod egress): %w", errdefs.ErrNotImplemented)
	}
	if len(req.Metadata) > 64 {
		return 0, nil, fmt.Errorf("metadata: at most 64 entries: %w", errdefs.ErrInvalidArgument)
	}
	for k, v := range req.Metadata {
		if k == "" || len(k) > 256 || len(v) > 4096 {
			return 0, nil, fmt.Errorf("metadata %q: keys of 1-256 and values of up to 4096 characters: %w", k, errdefs.ErrInvalidArgument)
		}
	}
	for k := range req.EnvVars {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return 0, nil, fmt.Errorf("envVars %q: not a variable name: %w", k, errdefs.ErrInvalidArgument)
		}
		if k == agentnet.EnvKey {
			return 0, nil, fmt.Errorf("envVars %q: reserved for hutch's agent: %w", k, errdefs.ErrInvalidArgument)
		}
	}
	ks := kubeSandbox{
		ID: kubeNewID(), Tenant: tenantName, Template: req.TemplateID, Image: image,
		Metadata: req.Metadata, Env: req.EnvVars, CPUs: s.kube.cfg.CPUs, Memory: s.kube.cfg.Memory,
		Network: mode, Timeout: timeout, Now: time.Now(),
		Private: req.Network != nil && req.Network.AllowPublicTraffic != nil && !*req.Network.AllowPublicTraffic,
	}
	if snap != nil {
		// The snapshot's processes carry on: its image, environment,
		// limits and network are the sandbox's it was made of.
		if len(req.EnvVars) > 0 {
			return 0, nil, fmt.Errorf("envVars: a sandbox made from snapshot %q on Kubernetes placement carries on the snapshot's processes with their environment; give none: %w", req.TemplateID, errdefs.ErrInvalidArgument)
		}
		if err := fromSnapshot(&ks, snap); err != nil {
			return 0, nil, err
		}
		if (req.AllowInternetAccess != nil || req.Network != nil) && mode != ks.Network {
			return 0, nil, fmt.Errorf("network %s: snapshot %q has network %s, which a sandbox made from it keeps: %w", mode, req.TemplateID, ks.Network, errdefs.ErrInvalidArgument)
		}
	}
	release, err := s.admit(r.Context(), tenantName, usageOf(engine.CreateRequest{CPUs: ks.CPUs, Memory: ks.Memory}))
	if err != nil {
		return 0, nil, err
	}
	defer release()
	start := time.Now()
	sb, err := s.kube.create(context.WithoutCancel(r.Context()), ks)
	if err != nil {
		return 0, nil, err
	}
	s.metrics.created(tenantName, time.Since(start))
	s.log.Info("created", "sandbox", sb.ID, "tenant", tenantName, "template", req.TemplateID, "pod", kubePodName(sb.ID), "duration", time.Since(start))
	return http.StatusCreated, s.sandboxJSON(sb), nil
}

// kubeRecover deletes the server's pods whose deadline passed or that
// ended, and what a server that died mid-operation left.
func (s *Server) kubeRecover(ctx context.Context) (int, error) {
	all, err := s.kube.list(ctx, "")
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
		stuck := sb.State == engine.StateCreating && now.Sub(sb.Created) > 2*s.kube.cfg.StartTimeout
		if !expired && !stuck && sb.State != engine.StateStopped {
			continue
		}
		s.forget(sb.ID)
		if err := s.kube.remove(ctx, sb.ID); err != nil {
			s.log.Warn("delete sandbox pod", "sandbox", sb.ID, "err", err)
			continue
		}
		n++
		s.log.Info("removed sandbox", "sandbox", sb.ID, "tenant", sb.Labels[labelTenant], "expired", expired, "state", sb.State)
	}
	if last := s.kube.leftoversSwept.Load(); now.UnixNano()-last < int64(kubeLeftoverInterval) {
		return n, nil
	}
	s.kube.leftoversSwept.Store(now.UnixNano())
	return n, s.kubeSweepLeftovers(ctx)
}

// notOnKube answers a call that Kubernetes placement does not serve.
func notOnKube(what string) apiHandler {
	return func(*http.Request, string) (int, any, error) {
		return 0, nil, fmt.Errorf("%s is not supported when hutch serve places sandboxes on Kubernetes (--kubeconfig): %w", what, errdefs.ErrNotImplemented)
	}
}
