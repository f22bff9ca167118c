package kubeplace

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"hutch.dev/hutch/agent/agentnet"
	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/policy"
	"hutch.dev/hutch/serve/kube"
	"hutch.dev/hutch/serve/placement"
)

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
	// AutoResume: a request without a key may resume it when paused.
	AutoResume bool
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
func renderPod(kc *Config, sb kubeSandbox) (*kube.Pod, error) {
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
	} else {
		p.Metadata.Annotations[kubeShimEgress] = "public"
	}
	if sb.Private {
		p.Metadata.Annotations[kubeAnnPrivate] = "true"
	}
	if sb.AutoResume {
		p.Metadata.Annotations[kubeAnnAutoResume] = "true"
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
	if l[kubeLabelManaged] != kubeManagedBy || !placement.ValidID(l[kubeLabelID]) || l[kubeLabelTenant] == "" {
		return nil
	}
	a := p.Metadata.Annotations
	sb := &engine.Sandbox{
		ID: l[kubeLabelID], Network: a[kubeAnnNetwork], Timeout: a[kubeAnnTimeout],
		Labels: map[string]string{placement.LabelTenant: l[kubeLabelTenant], placement.LabelTemplate: a[kubeAnnTemplate]},
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
			sb.Labels[placement.MetaPrefix+k] = v
		}
	}
	if a[kubeAnnPrivate] == "true" {
		sb.Labels[placement.LabelPrivate] = "true"
	}
	if a[kubeAnnAutoResume] == "true" {
		sb.Labels[placement.LabelAutoResume] = "true"
	}
	if g := a[kubeAnnTokenGeneration]; g != "" {
		sb.Labels[placement.LabelTokenGeneration] = g
	}
	// The writable layer's bound: the pod's annotation, else the shim's
	// default, which is hutch's.
	sb.Disk = policy.DefaultDisk
	if n, err := policy.ParseSize(a[kubeShimDisk]); err == nil && n > 0 {
		sb.Disk = n
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
