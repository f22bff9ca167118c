package serve

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/placement"
)

// volumeJSON is E2B's Volume and VolumeAndToken. The token opens E2B's
// volume content API (/volumecontent/..., volumecontent.go) for this
// volume only.
type volumeJSON struct {
	VolumeID string  `json:"volumeID"`
	Name     string  `json:"name"`
	Token    *string `json:"token,omitempty"`
}

func (s *Server) volumeAndToken(tenantName, name string) volumeJSON {
	tok := s.volumeToken(tenantName, name)
	return volumeJSON{VolumeID: name, Name: name, Token: &tok}
}

// volumeMountJSON is E2B's SandboxVolumeMount.
type volumeMountJSON struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

func (s *Server) createVolume(r *http.Request, tenantName string) (int, any, error) {
	var body struct {
		Name string `json:"name"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	if body.Name == "" {
		return 0, nil, fmt.Errorf("name: required: %w", errdefs.ErrInvalidArgument)
	}
	if err := s.place.CreateVolume(r.Context(), tenantName, body.Name); err != nil {
		return 0, nil, err
	}
	s.log.Info("volume created", "tenant", tenantName, "volume", body.Name)
	return http.StatusCreated, s.volumeAndToken(tenantName, body.Name), nil
}

func (s *Server) listVolumes(r *http.Request, tenantName string) (int, any, error) {
	names, err := s.place.ListVolumes(r.Context(), tenantName)
	if err != nil {
		return 0, nil, err
	}
	out := []volumeJSON{}
	for _, name := range names {
		out = append(out, volumeJSON{VolumeID: name, Name: name})
	}
	return http.StatusOK, out, nil
}

func (s *Server) getVolume(r *http.Request, tenantName string) (int, any, error) {
	name := r.PathValue("volumeID")
	if err := s.place.GetVolume(r.Context(), tenantName, name); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, s.volumeAndToken(tenantName, name), nil
}

// deleteVolume removes a volume no sandbox mounts (running or paused);
// one in use is refused with 409 naming the sandboxes.
func (s *Server) deleteVolume(r *http.Request, tenantName string) (int, any, error) {
	name := r.PathValue("volumeID")
	if err := s.place.DeleteVolume(r.Context(), tenantName, name); err != nil {
		return 0, nil, err
	}
	s.log.Info("volume removed", "tenant", tenantName, "volume", name)
	return http.StatusNoContent, nil, nil
}

// sandboxVolumeMounts are the E2B volumeMounts sb was created with.
func sandboxVolumeMounts(sb *engine.Sandbox) []volumeMountJSON {
	var vms []volumeMountJSON
	if l := sb.Labels[placement.LabelVolumes]; l != "" {
		json.Unmarshal([]byte(l), &vms) //nolint:errcheck // written by the create
	}
	return vms
}
