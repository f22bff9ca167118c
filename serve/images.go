package serve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/placement"
)

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

type snapshotJSON struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// snapshotSandbox makes a sandbox's memory and files a template of its
// tenant's; a paused sandbox is resumed first.
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
	if err := s.place.CheckSnapshotName(tenantName, id); err != nil {
		return 0, nil, err
	}
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	if err := s.place.Unsupported(placement.FeatureSnapshots, "snapshots"); err != nil {
		return 0, nil, err
	}
	if sb.State == engine.StatePaused {
		if sb, err = s.resume(r.Context(), sb, tenantName); err != nil {
			return 0, nil, err
		}
	}
	if exists, err := s.place.HasSnapshot(r.Context(), tenantName, id); err != nil {
		return 0, nil, err
	} else if exists {
		return 0, nil, fmt.Errorf("snapshot %q already exists: %w", id, errdefs.ErrConflict)
	}
	release, err := s.admit(r.Context(), tenantName, snapshotUsage(sb))
	if err != nil {
		return 0, nil, err
	}
	defer release()
	if err := s.place.Snapshot(context.WithoutCancel(r.Context()), sb.ID, tenantName, id); err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, snapshotJSON{SnapshotID: id, Names: []string{id}}, nil
}

// listSnapshots is GET /snapshots: the tenant's snapshots, of one sandbox
// (?sandboxID=) or of one name (?name=).
func (s *Server) listSnapshots(r *http.Request, tenantName string) (int, any, error) {
	q := r.URL.Query()
	ids, err := s.place.ListSnapshots(r.Context(), tenantName, q.Get("sandboxID"), q.Get("name"))
	if err != nil {
		return 0, nil, err
	}
	out := []snapshotJSON{}
	for _, id := range ids {
		out = append(out, snapshotJSON{SnapshotID: id, Names: []string{id}})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SnapshotID < out[j].SnapshotID })
	return http.StatusOK, out, nil
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
	ts, err := s.place.ListTemplates(r.Context(), tenantName)
	if err != nil {
		return 0, nil, err
	}
	out := []templateJSON{}
	for _, t := range ts {
		out = append(out, templateJSON{
			TemplateID: t.ID, BuildID: t.BuildID, CPUCount: 2, MemoryMB: 2048, DiskSizeMB: 10240,
			Public: t.Public, Aliases: []string{t.ID}, Names: []string{t.ID}, CreatedAt: t.Created, UpdatedAt: t.Created,
			EnvdVersion: EnvdVersion, BuildStatus: "ready",
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].TemplateID < out[j].TemplateID })
	return http.StatusOK, out, nil
}

// deleteTemplate removes one of the tenant's own templates (a snapshot);
// shared ones cannot be removed through the API.
func (s *Server) deleteTemplate(r *http.Request, tenantName string) (int, any, error) {
	id := r.PathValue("id")
	if err := checkTemplateID(id); err != nil {
		return 0, nil, err
	}
	if err := s.place.DeleteTemplate(context.WithoutCancel(r.Context()), tenantName, id); err != nil {
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
