package kubeplace

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/agent/agentnet"
	"hutch.dev/hutch/serve/kube"
)

// The data plane of Kubernetes placement goes to the agent's network
// endpoint on the pod network (package agentnet), not through the API
// server: each sandbox's agent has its own random key, held in Secret
// hutch-ID (owned by the pod, so that the cluster deletes it with the pod)
// and given to the agent as an environment variable from that Secret;
// the agent drops it from its environment before anything runs. Every
// connection proves the key by challenge-response and is sealed with
// keys derived from it. A sandbox whose network is none has no pod
// network to listen on: its commands and files go through pods/exec.

// kubeAgentSecretKey is the key of the Secret's data holding the agent's
// key (hex).
const kubeAgentSecretKey = "agent-key"

// kubeEndpoint is how the server reaches a sandbox's agent.
type kubeEndpoint struct {
	// addr is the agent's address on the pod network; "": pods/exec.
	addr string
	key  []byte
}

// newAgentKey is a new random agent key, as the Secret holds it.
func newAgentKey() string {
	b := make([]byte, agentnet.KeySize)
	rand.Read(b) //nolint:errcheck // never fails
	return hex.EncodeToString(b)
}

// agentSecret is the Secret holding key for sandbox id's agent.
func (k *Placement) agentSecret(id, tenantName, key string) *kube.Secret {
	return &kube.Secret{
		APIVersion: "v1", Kind: "Secret", Type: "Opaque",
		Metadata: kube.Meta{
			Name: kubePodName(id), Namespace: k.cfg.Namespace,
			Labels: map[string]string{kubeLabelManaged: kubeManagedBy, kubeLabelID: id, kubeLabelTenant: tenantName},
		},
		Data: map[string][]byte{kubeAgentSecretKey: []byte(key)},
	}
}

// endpoint is how to reach sandbox id's agent: cached, else read from
// its pod (address, network) and Secret (key).
func (k *Placement) endpoint(ctx context.Context, id string) (*kubeEndpoint, error) {
	k.epMu.Lock()
	ep := k.eps[id]
	k.epMu.Unlock()
	if ep != nil {
		return ep, nil
	}
	p, err := k.c.GetPod(ctx, k.cfg.Namespace, kubePodName(id))
	if err != nil {
		return nil, err
	}
	ep = &kubeEndpoint{}
	if !podOnAPIExec(p) {
		if p.Status.PodIP == "" {
			return nil, fmt.Errorf("sandbox %s: its pod has no address yet: %w", id, errdefs.ErrUnavailable)
		}
		sec, err := k.c.GetSecret(ctx, k.cfg.Namespace, kubePodName(id))
		if err != nil {
			return nil, fmt.Errorf("sandbox %s: the agent's key: %w", id, err)
		}
		key, err := hex.DecodeString(string(sec.Data[kubeAgentSecretKey]))
		if err != nil || len(key) != agentnet.KeySize {
			return nil, fmt.Errorf("sandbox %s: secret %s holds no agent key: %w", id, sec.Metadata.Name, errdefs.ErrFailedPrecondition)
		}
		ep.addr, ep.key = net.JoinHostPort(p.Status.PodIP, strconv.Itoa(agentnet.Port)), key
	}
	k.remember(id, ep)
	return ep, nil
}

// podOnAPIExec tells whether the server reaches pod p through pods/exec:
// its agent has no endpoint (network none, or a pod from before the
// endpoint).
func podOnAPIExec(p *kube.Pod) bool {
	if p.Metadata.Annotations[kubeShimNetwork] == "none" || len(p.Spec.Containers) == 0 {
		return true
	}
	cmd := p.Spec.Containers[0].Command
	return len(cmd) < 2 || cmd[1] != kubeAgentListen
}

func (k *Placement) remember(id string, ep *kubeEndpoint) {
	k.epMu.Lock()
	defer k.epMu.Unlock()
	if ep == nil {
		delete(k.eps, id)
		return
	}
	if k.eps == nil {
		k.eps = map[string]*kubeEndpoint{}
	}
	k.eps[id] = ep
}

// exec runs req in its sandbox: through the agent's endpoint, or
// pods/exec for a sandbox without one.
func (k *Placement) exec(ctx context.Context, req kube.ExecRequest) (int, error) {
	id := strings.TrimPrefix(req.Pod, kubePodPrefix)
	ep, err := k.endpoint(ctx, id)
	if err != nil {
		return -1, err
	}
	if ep.addr == "" {
		return k.c.Exec(ctx, req)
	}
	code, err := kube.AgentExec(ctx, ep.addr, ep.key, req)
	if err != nil {
		// Read the pod again next time: it may have gone.
		k.remember(id, nil)
	}
	return code, err
}

// DialPort connects to port on sandbox id's loopback through its agent's
// endpoint: a port preview (getHost). A sandbox without network has
// none to preview.
func (k *Placement) DialPort(ctx context.Context, id string, port uint16) (net.Conn, error) {
	ep, err := k.endpoint(ctx, id)
	if err != nil {
		return nil, err
	}
	if ep.addr == "" {
		return nil, fmt.Errorf("port %d: sandbox %s has no network (created without allowInternetAccess), so no ports to reach on Kubernetes placement: %w", port, id, errdefs.ErrNotImplemented)
	}
	c, err := kube.AgentDial(ctx, ep.addr, ep.key, int(port))
	if errors.Is(err, errdefs.ErrUnavailable) {
		// The agent did not answer: read the pod again next time.
		k.remember(id, nil)
	}
	return c, err
}
