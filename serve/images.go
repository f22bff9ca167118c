package serve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/overlay"
)

// A tenant's own images (its snapshots) are named tenantRepo/TENANT/ID in
// the engine's store; its templateIDs are the ID alone. Images outside
// tenantRepo (base, busybox, what the host's operator built) are shared:
// every tenant may start from them and none may change them.
const tenantRepo = "tenants"

// templateIDRE leaves the lengths (at most 128 each side of ':') to
// checkTemplateID: a bounded repetition is a large compile at every
// process start.
var templateIDRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?$`)

func checkTemplateID(id string) error {
	repo, tag, _ := strings.Cut(id, ":")
	if len(repo) > 128 || len(tag) > 128 || !templateIDRE.MatchString(id) {
		return fmt.Errorf("templateID %q: want a name of [a-z0-9._-] (optionally :TAG): %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

// snapshotID is the ID of a new snapshot asked to be named name: name,
// or a new one if empty.
func snapshotID(name string) (string, error) {
	if name == "" {
		return "snap-" + randomHex(8), nil
	}
	if err := checkTemplateID(name); err != nil {
		return "", fmt.Errorf("name: %w", err)
	}
	return name, nil
}

func tenantImage(tenantName, id string) string {
	return tenantRepo + "/" + tenantName + "/" + id
}

// templateImage resolves a create's templateID for tenant: the tenant's
// own image of that name, else a shared one.
func (s *Server) templateImage(ctx context.Context, tenantName, id string) (string, error) {
	if err := checkTemplateID(id); err != nil {
		return "", err
	}
	own := tenantImage(tenantName, id)
	if _, err := s.eng.Images().Get(ctx, own); err == nil {
		return own, nil
	}
	norm, err := overlay.ParseName(id)
	if err != nil {
		return "", err
	}
	// The default and test images are made on first use.
	if norm == engine.DefaultImage || norm == engine.TestImage {
		return norm, nil
	}
	if _, err := s.eng.Images().Get(ctx, norm); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return "", fmt.Errorf("template %q not found: %w", id, errdefs.ErrNotFound)
		}
		return "", err
	}
	return norm, nil
}

type snapshotJSON struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func (s *Server) snapshotSandbox(r *http.Request, tenantName string) (int, any, error) {
	var body struct {
		Name string `json:"name"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	id, err := snapshotID(body.Name)
	if err != nil {
		return 0, nil, err
	}
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	if sb.State == engine.StatePaused {
		if sb, err = s.resume(r.Context(), sb, tenantName); err != nil {
			return 0, nil, err
		}
	}
	if _, err := s.eng.Images().Get(r.Context(), tenantImage(tenantName, id)); err == nil {
		return 0, nil, fmt.Errorf("snapshot %q already exists: %w", id, errdefs.ErrConflict)
	}
	if _, err := s.eng.Snapshot(context.WithoutCancel(r.Context()), sb.ID, engine.SnapshotRequest{Name: tenantImage(tenantName, id)}); err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, snapshotJSON{SnapshotID: id, Names: []string{id}}, nil
}

// tenantImages are tenant's own images by templateID.
func (s *Server) tenantImages(ctx context.Context, tenantName string) (map[string]overlay.Image, error) {
	all, err := s.eng.Images().List(ctx)
	if err != nil {
		return nil, err
	}
	prefix := tenantImage(tenantName, "")
	out := map[string]overlay.Image{}
	for _, img := range all {
		if id, ok := strings.CutPrefix(img.Name, prefix); ok {
			out[strings.TrimSuffix(id, ":"+overlay.DefaultTag)] = img
		}
	}
	return out, nil
}

func (s *Server) listSnapshots(r *http.Request, tenantName string) (int, any, error) {
	q := r.URL.Query()
	sandboxID, name := q.Get("sandboxID"), q.Get("name")
	imgs, err := s.tenantImages(r.Context(), tenantName)
	if err != nil {
		return 0, nil, err
	}
	out := []snapshotJSON{}
	for id, img := range imgs {
		if name != "" && id != name {
			continue
		}
		if sandboxID != "" && !snapshotOf(img, sandboxID) {
			continue
		}
		out = append(out, snapshotJSON{SnapshotID: id, Names: []string{id}})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SnapshotID < out[j].SnapshotID })
	return http.StatusOK, out, nil
}

// snapshotOf tells whether img is a snapshot of sandbox id: the engine
// records "hutch snapshot SHORTID" as its last history entry.
func snapshotOf(img overlay.Image, id string) bool {
	h := img.Config.History
	if len(h) == 0 || len(id) < 12 {
		return false
	}
	return strings.HasSuffix(h[len(h)-1].CreatedBy, " "+id[:12])
}

// templateJSON is E2B's Template, for a tenant's images and the shared
// ones.
type templateJSON struct {
	TemplateID    string    `json:"templateID"`
	BuildID       string    `json:"buildID"`
	CPUCount      int       `json:"cpuCount"`
	MemoryMB      int64     `json:"memoryMB"`
	DiskSizeMB    int64     `json:"diskSizeMB"`
	Public        bool      `json:"public"`
	Aliases       []string  `json:"aliases"`
	Names         []string  `json:"names"`
	CreatedAt     time.Time `json:"createdAt"`
	UpdatedAt     time.Time `json:"updatedAt"`
	CreatedBy     *string   `json:"createdBy"`
	LastSpawnedAt *string   `json:"lastSpawnedAt"`
	SpawnCount    int       `json:"spawnCount"`
	BuildCount    int       `json:"buildCount"`
	EnvdVersion   string    `json:"envdVersion"`
	BuildStatus   string    `json:"buildStatus"`
}

func (s *Server) listTemplates(r *http.Request, tenantName string) (int, any, error) {
	all, err := s.eng.Images().List(r.Context())
	if err != nil {
		return 0, nil, err
	}
	own := tenantImage(tenantName, "")
	out := []templateJSON{}
	for _, img := range all {
		id := img.Name
		public := true
		if rest, ok := strings.CutPrefix(img.Name, own); ok {
			id, public = rest, false
		} else if strings.HasPrefix(img.Name, tenantRepo+"/") {
			continue
		}
		id = strings.TrimSuffix(id, ":"+overlay.DefaultTag)
		out = append(out, templateJSON{
			TemplateID: id, BuildID: img.Digest.Encoded()[:12], CPUCount: 2, MemoryMB: 2048, DiskSizeMB: 10240,
			Public: public, Aliases: []string{id}, Names: []string{id}, CreatedAt: img.Created, UpdatedAt: img.Created,
			EnvdVersion: EnvdVersion, BuildStatus: "ready",
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].TemplateID < out[j].TemplateID })
	return http.StatusOK, out, nil
}

// deleteTemplate removes one of the tenant's own images (a snapshot);
// shared images cannot be removed through the API.
func (s *Server) deleteTemplate(r *http.Request, tenantName string) (int, any, error) {
	id := r.PathValue("id")
	if err := checkTemplateID(id); err != nil {
		return 0, nil, err
	}
	name := tenantImage(tenantName, id)
	if _, err := s.eng.Images().Get(r.Context(), name); err != nil {
		return 0, nil, fmt.Errorf("template %q not found: %w", id, errdefs.ErrNotFound)
	}
	if err := s.eng.Images().Remove(r.Context(), name); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

// randomHex is n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b)
}
