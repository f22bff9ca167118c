package kube

import (
	"context"
	"net/http"
	"net/url"

	"github.com/containerd/errdefs"
)

// Secret is the part of a core/v1 Secret that hutch serve writes and
// reads: Data's values are bytes (base64 in JSON, as the API has them).
type Secret struct {
	APIVersion string            `json:"apiVersion,omitempty"`
	Kind       string            `json:"kind,omitempty"`
	Metadata   Meta              `json:"metadata"`
	Type       string            `json:"type,omitempty"`
	Data       map[string][]byte `json:"data,omitempty"`
}

func secretsPath(ns string) string {
	return "/api/v1/namespaces/" + url.PathEscape(ns) + "/secrets"
}

// CreateSecret creates sec in namespace ns.
func (c *Client) CreateSecret(ctx context.Context, ns string, sec *Secret) error {
	return c.do(ctx, http.MethodPost, secretsPath(ns), nil, "application/json", sec, nil)
}

// GetSecret reads secret name of namespace ns; ErrNotFound if there is
// none.
func (c *Client) GetSecret(ctx context.Context, ns, name string) (*Secret, error) {
	var out Secret
	if err := c.do(ctx, http.MethodGet, secretsPath(ns)+"/"+url.PathEscape(name), nil, "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListSecrets lists the Secrets of namespace ns that match the label
// selector.
func (c *Client) ListSecrets(ctx context.Context, ns, selector string) ([]Secret, error) {
	var out struct {
		Items []Secret `json:"items"`
	}
	q := url.Values{}
	if selector != "" {
		q.Set("labelSelector", selector)
	}
	if err := c.do(ctx, http.MethodGet, secretsPath(ns), q, "", nil, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}

// PatchSecret applies the JSON merge patch patch to secret name (a nil
// value removes a key; []byte values of data go as base64).
func (c *Client) PatchSecret(ctx context.Context, ns, name string, patch any) error {
	return c.do(ctx, http.MethodPatch, secretsPath(ns)+"/"+url.PathEscape(name), nil, "application/merge-patch+json", patch, nil)
}

// SetSecretOwner makes pod owner the owner of secret name: the cluster
// deletes the secret with the pod.
func (c *Client) SetSecretOwner(ctx context.Context, ns, name string, owner *Pod) error {
	patch := map[string]any{"metadata": map[string]any{"ownerReferences": []OwnerRef{{
		APIVersion: "v1", Kind: "Pod", Name: owner.Metadata.Name, UID: owner.Metadata.UID,
	}}}}
	return c.do(ctx, http.MethodPatch, secretsPath(ns)+"/"+url.PathEscape(name), nil, "application/merge-patch+json", patch, nil)
}

// DeleteSecret deletes secret name. One that is already gone is not an
// error.
func (c *Client) DeleteSecret(ctx context.Context, ns, name string) error {
	err := c.do(ctx, http.MethodDelete, secretsPath(ns)+"/"+url.PathEscape(name), nil, "", nil, nil)
	if err != nil && errdefs.IsNotFound(err) {
		return nil
	}
	return err
}
