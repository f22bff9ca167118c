// Package kube is the small Kubernetes client `hutch serve` places sandboxes
// with: pods created, read, listed, annotated and deleted through the API
// server's REST API, and commands run in them through the pods/exec
// subresource (the v5.channel.k8s.io WebSocket protocol).
//
// It speaks plain JSON over net/http with its own minimal Pod type: it
// does not use client-go, whose typed clientset costs every hutch command
// its scheme registration at start. It reads a kubeconfig's current
// context (server, CA, client certificate or bearer token) and nothing
// else of it: no exec credential plugins, no auth providers.
package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"go.yaml.in/yaml/v3"
)

// Client talks to one API server as one user.
type Client struct {
	server *url.URL
	tls    *tls.Config
	token  string
	http   *http.Client
}

// kubeconfig is the part of a kubeconfig file Client reads.
type kubeconfig struct {
	CurrentContext string `yaml:"current-context"`
	Clusters       []struct {
		Name    string `yaml:"name"`
		Cluster struct {
			Server                   string `yaml:"server"`
			CertificateAuthority     string `yaml:"certificate-authority"`
			CertificateAuthorityData string `yaml:"certificate-authority-data"`
			InsecureSkipTLSVerify    bool   `yaml:"insecure-skip-tls-verify"`
		} `yaml:"cluster"`
	} `yaml:"clusters"`
	Users []struct {
		Name string `yaml:"name"`
		User struct {
			ClientCertificate     string `yaml:"client-certificate"`
			ClientCertificateData string `yaml:"client-certificate-data"`
			ClientKey             string `yaml:"client-key"`
			ClientKeyData         string `yaml:"client-key-data"`
			Token                 string `yaml:"token"`
			TokenFile             string `yaml:"tokenFile"`
			Exec                  any    `yaml:"exec"`
			AuthProvider          any    `yaml:"auth-provider"`
		} `yaml:"user"`
	} `yaml:"users"`
	Contexts []struct {
		Name    string `yaml:"name"`
		Context struct {
			Cluster   string `yaml:"cluster"`
			User      string `yaml:"user"`
			Namespace string `yaml:"namespace"`
		} `yaml:"context"`
	} `yaml:"contexts"`
}

// Load makes a client from the current context of the kubeconfig file
// path. It also returns the context's namespace ("" if it names none).
func Load(path string) (*Client, string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	var kc kubeconfig
	if err := yaml.Unmarshal(b, &kc); err != nil {
		return nil, "", fmt.Errorf("kubeconfig %s: %v: %w", path, err, errdefs.ErrInvalidArgument)
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("kubeconfig %s: "+format+": %w", append(append([]any{path}, args...), errdefs.ErrInvalidArgument)...)
	}
	dir := filepath.Dir(path)
	file := func(p, data string) ([]byte, error) {
		if data != "" {
			return base64.StdEncoding.DecodeString(data)
		}
		if p == "" {
			return nil, nil
		}
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		return os.ReadFile(p)
	}
	ctxName := kc.CurrentContext
	var clusterName, userName, ns string
	found := false
	for _, c := range kc.Contexts {
		if c.Name == ctxName {
			clusterName, userName, ns, found = c.Context.Cluster, c.Context.User, c.Context.Namespace, true
		}
	}
	if !found {
		return nil, "", bad("current-context %q: no such context", ctxName)
	}
	c := &Client{tls: &tls.Config{MinVersion: tls.VersionTLS12}}
	found = false
	for _, cl := range kc.Clusters {
		if cl.Name != clusterName {
			continue
		}
		found = true
		if c.server, err = url.Parse(cl.Cluster.Server); err != nil || c.server.Host == "" {
			return nil, "", bad("cluster %q: server %q is not a URL", clusterName, cl.Cluster.Server)
		}
		ca, err := file(cl.Cluster.CertificateAuthority, cl.Cluster.CertificateAuthorityData)
		if err != nil {
			return nil, "", bad("cluster %q: certificate authority: %v", clusterName, err)
		}
		if ca != nil {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(ca) {
				return nil, "", bad("cluster %q: certificate authority holds no PEM certificate", clusterName)
			}
			c.tls.RootCAs = pool
		}
		c.tls.InsecureSkipVerify = cl.Cluster.InsecureSkipTLSVerify //nolint:gosec // the operator's explicit choice
	}
	if !found {
		return nil, "", bad("context %q: no cluster %q", ctxName, clusterName)
	}
	found = false
	for _, u := range kc.Users {
		if u.Name != userName {
			continue
		}
		found = true
		if u.User.Exec != nil || u.User.AuthProvider != nil {
			return nil, "", bad("user %q: exec and auth-provider credentials are not supported: give a client certificate or a token", userName)
		}
		cert, err := file(u.User.ClientCertificate, u.User.ClientCertificateData)
		if err != nil {
			return nil, "", bad("user %q: client certificate: %v", userName, err)
		}
		key, err := file(u.User.ClientKey, u.User.ClientKeyData)
		if err != nil {
			return nil, "", bad("user %q: client key: %v", userName, err)
		}
		if cert != nil || key != nil {
			pair, err := tls.X509KeyPair(cert, key)
			if err != nil {
				return nil, "", bad("user %q: client certificate and key: %v", userName, err)
			}
			c.tls.Certificates = []tls.Certificate{pair}
		}
		c.token = u.User.Token
		if u.User.TokenFile != "" {
			t, err := file(u.User.TokenFile, "")
			if err != nil {
				return nil, "", bad("user %q: token file: %v", userName, err)
			}
			c.token = strings.TrimSpace(string(t))
		}
	}
	if !found && userName != "" {
		return nil, "", bad("context %q: no user %q", ctxName, userName)
	}
	c.http = &http.Client{Transport: &http.Transport{
		TLSClientConfig: c.tls.Clone(), Proxy: http.ProxyFromEnvironment,
		ForceAttemptHTTP2: true, IdleConnTimeout: 90 * time.Second,
	}}
	return c, ns, nil
}

// Server is the API server's URL.
func (c *Client) Server() string { return c.server.String() }

// status is the API server's Status object, its answer to a failed call.
type status struct {
	Status  string `json:"status"`
	Message string `json:"message"`
	Reason  string `json:"reason"`
	Code    int    `json:"code"`
	Details *struct {
		Causes []struct {
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"causes"`
	} `json:"details"`
}

// apiError turns a failed call's answer into an error of its kind.
func apiError(what string, code int, body []byte) error {
	var st status
	msg := strings.TrimSpace(string(body))
	if json.Unmarshal(body, &st) == nil && st.Message != "" {
		msg = st.Message
	}
	var kind error
	switch code {
	case http.StatusNotFound:
		kind = errdefs.ErrNotFound
	case http.StatusConflict:
		kind = errdefs.ErrAlreadyExists
		if st.Reason == "Conflict" {
			kind = errdefs.ErrConflict
		}
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		kind = errdefs.ErrInvalidArgument
	case http.StatusUnauthorized:
		kind = errdefs.ErrUnauthenticated
	case http.StatusForbidden:
		kind = errdefs.ErrPermissionDenied
	case http.StatusTooManyRequests:
		kind = errdefs.ErrResourceExhausted
	case http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		kind = errdefs.ErrUnavailable
	default:
		kind = errdefs.ErrUnknown
	}
	return fmt.Errorf("kubernetes: %s: %s (HTTP %d): %w", what, msg, code, kind)
}

// do makes a call; out, if set, receives the answer's JSON.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, contentType string, in, out any) error {
	u := *c.server
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawQuery = query.Encode()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", contentType)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("kubernetes: %s %s: %w: %w", method, path, err, errdefs.ErrUnavailable)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("kubernetes: %s %s: %w: %w", method, path, err, errdefs.ErrUnavailable)
	}
	if resp.StatusCode/100 != 2 {
		return apiError(method+" "+path, resp.StatusCode, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("kubernetes: %s %s: decode the answer: %w", method, path, err)
		}
	}
	return nil
}

func podsPath(ns string) string { return "/api/v1/namespaces/" + url.PathEscape(ns) + "/pods" }

// CreatePod creates p in namespace ns and returns it as the API server
// stored it.
func (c *Client) CreatePod(ctx context.Context, ns string, p *Pod) (*Pod, error) {
	var out Pod
	if err := c.do(ctx, http.MethodPost, podsPath(ns), nil, "application/json", p, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetPod reads pod name of namespace ns; ErrNotFound if there is none.
func (c *Client) GetPod(ctx context.Context, ns, name string) (*Pod, error) {
	var out Pod
	if err := c.do(ctx, http.MethodGet, podsPath(ns)+"/"+url.PathEscape(name), nil, "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListPods lists the pods of namespace ns that match the label selector.
func (c *Client) ListPods(ctx context.Context, ns, selector string) ([]Pod, error) {
	var out struct {
		Items []Pod `json:"items"`
	}
	q := url.Values{}
	if selector != "" {
		q.Set("labelSelector", selector)
	}
	if err := c.do(ctx, http.MethodGet, podsPath(ns), q, "", nil, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}

// PodEvents lists the events of pod name of namespace ns.
func (c *Client) PodEvents(ctx context.Context, ns, name string) ([]Event, error) {
	var out struct {
		Items []Event `json:"items"`
	}
	q := url.Values{}
	q.Set("fieldSelector", "involvedObject.kind=Pod,involvedObject.name="+name)
	if err := c.do(ctx, http.MethodGet, "/api/v1/namespaces/"+url.PathEscape(ns)+"/events", q, "", nil, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}

// PatchPodAnnotations sets (or, for a nil value, removes) annotations of
// pod name, with a JSON merge patch.
func (c *Client) PatchPodAnnotations(ctx context.Context, ns, name string, set map[string]*string) (*Pod, error) {
	patch := map[string]any{"metadata": map[string]any{"annotations": set}}
	var out Pod
	if err := c.do(ctx, http.MethodPatch, podsPath(ns)+"/"+url.PathEscape(name), nil, "application/merge-patch+json", patch, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeletePod deletes pod name, giving it grace seconds to stop. A pod that
// is already gone is not an error.
func (c *Client) DeletePod(ctx context.Context, ns, name string, grace int64) error {
	body := map[string]any{"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": grace, "propagationPolicy": "Background"}
	err := c.do(ctx, http.MethodDelete, podsPath(ns)+"/"+url.PathEscape(name), nil, "application/json", body, nil)
	if err != nil && errdefs.IsNotFound(err) {
		return nil
	}
	return err
}
