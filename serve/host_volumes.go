package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
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

// ownVolume returns tenant's volume name, or ErrNotFound: another
// tenant's volume of that name is not found either.
func (h *hostPlacement) ownVolume(ctx context.Context, tenantName, name string) (engine.Volume, error) {
	if err := checkVolumeName(tenantName, name); err != nil {
		return engine.Volume{}, err
	}
	v, err := h.eng.InspectVolume(ctx, tenantVolume(tenantName, name))
	if errors.Is(err, errdefs.ErrNotFound) {
		return engine.Volume{}, fmt.Errorf("volume %q not found: %w", name, errdefs.ErrNotFound)
	}
	return v, err
}

func (h *hostPlacement) CreateVolume(ctx context.Context, tenantName, name string) error {
	if err := checkVolumeName(tenantName, name); err != nil {
		return err
	}
	if _, err := h.eng.CreateVolume(ctx, tenantVolume(tenantName, name)); err != nil {
		if errors.Is(err, errdefs.ErrAlreadyExists) {
			return fmt.Errorf("volume %q already exists: %w", name, errdefs.ErrConflict)
		}
		return err
	}
	return nil
}

func (h *hostPlacement) GetVolume(ctx context.Context, tenantName, name string) error {
	_, err := h.ownVolume(ctx, tenantName, name)
	return err
}

func (h *hostPlacement) ListVolumes(ctx context.Context, tenantName string) ([]string, error) {
	all, err := h.eng.ListVolumes(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, v := range all {
		if name, ok := strings.CutPrefix(v.Name, tenantName+volumeSep); ok {
			out = append(out, name)
		}
	}
	return out, nil
}

// DeleteVolume removes a volume no sandbox mounts (running or paused);
// one in use is a conflict naming the sandboxes.
func (h *hostPlacement) DeleteVolume(ctx context.Context, tenantName, name string) error {
	v, err := h.ownVolume(ctx, tenantName, name)
	if err != nil {
		return err
	}
	inUse := func(ids []string) error {
		return fmt.Errorf("volume %q is in use by sandbox %s: kill them first: %w", name, strings.Join(ids, ", "), errdefs.ErrConflict)
	}
	if len(v.UsedBy) > 0 {
		return inUse(v.UsedBy)
	}
	if err := h.eng.RemoveVolume(ctx, v.Name, false); err != nil {
		switch {
		case errors.Is(err, errdefs.ErrNotFound):
			return fmt.Errorf("volume %q not found: %w", name, errdefs.ErrNotFound)
		case errors.Is(err, errdefs.ErrFailedPrecondition):
			// Mounted by a create since the look above.
			if v, ierr := h.eng.InspectVolume(ctx, v.Name); ierr == nil && len(v.UsedBy) > 0 {
				return inUse(v.UsedBy)
			}
			return fmt.Errorf("volume %q is in use: %w", name, errdefs.ErrConflict)
		}
		return err
	}
	return nil
}

// volumeMounts maps a create's E2B volumeMounts to the engine's mounts of
// tenant's own volumes, and the label that records them.
func (h *hostPlacement) volumeMounts(ctx context.Context, tenantName string, raw json.RawMessage) ([]engine.Mount, string, error) {
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
		v, err := h.ownVolume(ctx, tenantName, vm.Name)
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

// VolumesDisk is the disk tenant's volumes take (allocated blocks),
// beside its sandboxes' writable layers.
func (h *hostPlacement) VolumesDisk(ctx context.Context, tenantName string) (int64, error) {
	all, err := h.eng.ListVolumes(ctx)
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

var _ volumeRoots = (*hostPlacement)(nil)

// openVolume opens the files of tenant's volume name.
func (h *hostPlacement) openVolume(ctx context.Context, tenantName, name string) (*os.Root, error) {
	v, err := h.ownVolume(ctx, tenantName, name)
	if err != nil {
		return nil, err
	}
	return os.OpenRoot(v.Path)
}
