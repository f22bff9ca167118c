package client

import (
	"context"
	"net/http"
	"net/url"
)

// Volume is a tenant's named volume (E2B's Volume): storage that outlives
// sandboxes and that several sandboxes may mount at once.
type Volume struct {
	// ID is what GetVolume and DeleteVolume take; hutch serve makes it the
	// name.
	ID   string `json:"volumeID"`
	Name string `json:"name"`
}

// VolumeMount mounts the tenant's volume Name at Path in a new sandbox
// (E2B's SandboxVolumeMount).
type VolumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// CreateVolume creates a volume.
func (c *Client) CreateVolume(ctx context.Context, name string) (*Volume, error) {
	var out Volume
	if _, err := c.do(ctx, http.MethodPost, "/volumes", map[string]string{"name": name}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListVolumes lists the tenant's volumes.
func (c *Client) ListVolumes(ctx context.Context) ([]Volume, error) {
	var out []Volume
	if _, err := c.do(ctx, http.MethodGet, "/volumes", nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// GetVolume describes a volume.
func (c *Client) GetVolume(ctx context.Context, id string) (*Volume, error) {
	var out Volume
	if _, err := c.do(ctx, http.MethodGet, "/volumes/"+url.PathEscape(id), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteVolume removes a volume and its files; a volume a sandbox mounts
// is refused (409).
func (c *Client) DeleteVolume(ctx context.Context, id string) error {
	_, err := c.do(ctx, http.MethodDelete, "/volumes/"+url.PathEscape(id), nil, nil)
	return err
}
