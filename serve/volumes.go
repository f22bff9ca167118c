package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/policy"
)

// A tenant's volumes are the engine's named volumes TENANT.NAME: tenant
// names have no '.', so the first '.' ends the prefix and no name of one
// tenant is a name of another. Through the API a tenant sees, mounts and
// removes only its own, by NAME, which is also its E2B volumeID. Host
// directories are never mounted through the API.
const volumeSep = "."

// labelVolumes records a sandbox's E2B volumeMounts (JSON), for
// GET /sandboxes/{id}.
const labelVolumes = labelPrefix + "volumes"

// maxVolumeMounts is how many volumes one create may mount.
const maxVolumeMounts = 16

var volumeNameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

func tenantVolume(tenantName, name string) string { return tenantName + volumeSep + name }

// checkVolumeName validates a tenant's volume name: the engine's rules
// for the whole TENANT.NAME, told in the tenant's terms.
func checkVolumeName(tenantName, name string) error {
	max := 63 - len(tenantName) - len(volumeSep)
	if !volumeNameRE.MatchString(name) || len(name) > max {
		return fmt.Errorf("volume name %q: want letters, digits, '_', '.' or '-', starting with a letter or digit, at most %d characters: %w", name, max, errdefs.ErrInvalidArgument)
	}
	return policy.CheckVolumeName(tenantVolume(tenantName, name))
}

// volumeJSON is E2B's Volume and VolumeAndToken. The token is for E2B's
// volume content API (/volumecontent/...), which hutch serve does not
// serve: it is always empty.
type volumeJSON struct {
	VolumeID string  `json:"volumeID"`
	Name     string  `json:"name"`
	Token    *string `json:"token,omitempty"`
}

func volumeAndToken(name string) volumeJSON {
	empty := ""
	return volumeJSON{VolumeID: name, Name: name, Token: &empty}
}

// volumeMountJSON is E2B's SandboxVolumeMount.
type volumeMountJSON struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// ownVolume returns tenant's volume name, or ErrNotFound: another
// tenant's volume of that name is not found either.
func (s *Server) ownVolume(ctx context.Context, tenantName, name string) (engine.Volume, error) {
	if err := checkVolumeName(tenantName, name); err != nil {
		return engine.Volume{}, err
	}
	v, err := s.eng.InspectVolume(ctx, tenantVolume(tenantName, name))
	if errors.Is(err, errdefs.ErrNotFound) {
		return engine.Volume{}, fmt.Errorf("volume %q not found: %w", name, errdefs.ErrNotFound)
	}
	return v, err
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
	if err := checkVolumeName(tenantName, body.Name); err != nil {
		return 0, nil, err
	}
	if _, err := s.eng.CreateVolume(r.Context(), tenantVolume(tenantName, body.Name)); err != nil {
		if errors.Is(err, errdefs.ErrAlreadyExists) {
			return 0, nil, fmt.Errorf("volume %q already exists: %w", body.Name, errdefs.ErrConflict)
		}
		return 0, nil, err
	}
	s.log.Info("volume created", "tenant", tenantName, "volume", body.Name)
	return http.StatusCreated, volumeAndToken(body.Name), nil
}

func (s *Server) listVolumes(r *http.Request, tenantName string) (int, any, error) {
	all, err := s.eng.ListVolumes(r.Context())
	if err != nil {
		return 0, nil, err
	}
	out := []volumeJSON{}
	for _, v := range all {
		if name, ok := strings.CutPrefix(v.Name, tenantName+volumeSep); ok {
			out = append(out, volumeJSON{VolumeID: name, Name: name})
		}
	}
	return http.StatusOK, out, nil
}

func (s *Server) getVolume(r *http.Request, tenantName string) (int, any, error) {
	name := r.PathValue("volumeID")
	if _, err := s.ownVolume(r.Context(), tenantName, name); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, volumeAndToken(name), nil
}

// deleteVolume removes a volume no sandbox mounts (running or paused);
// one in use is refused with 409 naming the sandboxes.
func (s *Server) deleteVolume(r *http.Request, tenantName string) (int, any, error) {
	name := r.PathValue("volumeID")
	v, err := s.ownVolume(r.Context(), tenantName, name)
	if err != nil {
		return 0, nil, err
	}
	inUse := func(ids []string) error {
		return fmt.Errorf("volume %q is in use by sandbox %s: kill them first: %w", name, strings.Join(ids, ", "), errdefs.ErrConflict)
	}
	if len(v.UsedBy) > 0 {
		return 0, nil, inUse(v.UsedBy)
	}
	if err := s.eng.RemoveVolume(r.Context(), v.Name, false); err != nil {
		switch {
		case errors.Is(err, errdefs.ErrNotFound):
			return 0, nil, fmt.Errorf("volume %q not found: %w", name, errdefs.ErrNotFound)
		case errors.Is(err, errdefs.ErrFailedPrecondition):
			// Mounted by a create since the look above.
			if v, ierr := s.eng.InspectVolume(r.Context(), v.Name); ierr == nil && len(v.UsedBy) > 0 {
				return 0, nil, inUse(v.UsedBy)
			}
			return 0, nil, fmt.Errorf("volume %q is in use: %w", name, errdefs.ErrConflict)
		}
		return 0, nil, err
	}
	s.log.Info("volume removed", "tenant", tenantName, "volume", name)
	return http.StatusNoContent, nil, nil
}

// volumeMounts maps a create's E2B volumeMounts to the engine's mounts of
// tenant's own volumes, and the label that records them.
func (s *Server) volumeMounts(ctx context.Context, tenantName string, raw json.RawMessage) ([]engine.Mount, string, error) {
	if isNull(raw) {
		return nil, "", nil
	}
	var vms []volumeMountJSON
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&vms); err != nil {
		return nil, "", fmt.Errorf("volumeMounts: want [{\"name\": VOLUME, \"path\": PATH}]: %s: %w", strings.TrimPrefix(err.Error(), "json: "), errdefs.ErrInvalidArgument)
	}
	if len(vms) > maxVolumeMounts {
		return nil, "", fmt.Errorf("volumeMounts: at most %d: %w", maxVolumeMounts, errdefs.ErrInvalidArgument)
	}
	var out []engine.Mount
	for _, vm := range vms {
		if vm.Name == "" || vm.Path == "" {
			return nil, "", fmt.Errorf("volumeMounts: each needs a name and a path: %w", errdefs.ErrInvalidArgument)
		}
		if err := policy.CheckMountTarget(vm.Path); err != nil {
			return nil, "", fmt.Errorf("volumeMounts: %w", err)
		}
		v, err := s.ownVolume(ctx, tenantName, vm.Name)
		if err != nil {
			return nil, "", fmt.Errorf("volumeMounts: %w", err)
		}
		out = append(out, engine.Mount{Volume: v.Name, Target: vm.Path})
	}
	b, err := json.Marshal(vms)
	if err != nil {
		return nil, "", err
	}
	return out, string(b), nil
}

// sandboxVolumeMounts are the E2B volumeMounts sb was created with.
func sandboxVolumeMounts(sb *engine.Sandbox) []volumeMountJSON {
	var vms []volumeMountJSON
	if l := sb.Labels[labelVolumes]; l != "" {
		json.Unmarshal([]byte(l), &vms) //nolint:errcheck // written by createSandbox
	}
	return vms
}

// volumesDisk is the disk tenant's volumes take (allocated blocks), which
// counts toward its disk quota beside its sandboxes' writable layers.
func (s *Server) volumesDisk(ctx context.Context, tenantName string) (int64, error) {
	all, err := s.eng.ListVolumes(ctx)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, v := range all {
		if !strings.HasPrefix(v.Name, tenantName+volumeSep) {
			continue
		}
		filepath.WalkDir(v.Path, func(_ string, d fs.DirEntry, err error) error { //nolint:errcheck // a file removed meanwhile is not counted
			if err != nil {
				return nil
			}
			fi, err := d.Info()
			if err != nil {
				return nil
			}
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				total += st.Blocks * 512
			}
			return nil
		})
	}
	return total, nil
}

// serveVolumeContent answers E2B's volume content API, which the SDK calls
// with a volume's token rather than an API key: not served, whoever asks.
func serveVolumeContent(w http.ResponseWriter, r *http.Request) {
	writeError(w, http.StatusNotFound, fmt.Sprintf("%s %s: volume contents are not served by hutch serve; mount the volume in a sandbox (volumeMounts) and use its files", r.Method, r.URL.Path))
}
