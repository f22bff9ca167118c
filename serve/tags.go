package serve

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

// Template tags, as E2B defines them: a template NAME has tags, each
// naming one of its builds; NAME alone is NAME:latest. A build gets the
// tag of its name (NAME:TAG) and the tags it asks for; POST
// /templates/tags points more tags at the build a NAME:TAG names, DELETE
// /templates/tags removes tags, GET /templates/{templateID}/tags lists
// them, and a create of NAME:TAG starts the build the tag names. Each
// tag is an image of the tenant's, named tenantImage(tenant,
// NAME:TAG), so tags are the tenant's own as its templates are: another
// tenant's names answer 404.

// templateTag is E2B's TemplateTag.
type templateTag struct {
	Tag       string    `json:"tag"`
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"`
}

// tagger is a placement that keeps template tags: the host's.
type tagger interface {
	// tagTemplate points tenant's template id's tags at the build that
	// its tag from names, and returns that build's ID.
	tagTemplate(ctx context.Context, tenantName, id, from string, tags []string) (string, error)
	// untagTemplate removes tags of tenant's template id; an unknown
	// one fails before any is removed.
	untagTemplate(ctx context.Context, tenantName, id string, tags []string) error
	// templateTags lists tenant's template id's tags.
	templateTags(ctx context.Context, tenantName, id string) ([]templateTag, error)
}

// checkTags checks the tags of a request: at least one, each a tag.
func checkTags(tags []string) error {
	if len(tags) == 0 {
		return fmt.Errorf("tags: give at least one tag: %w", errdefs.ErrInvalidArgument)
	}
	for _, t := range tags {
		if err := checkTemplateID("t:" + t); err != nil {
			return fmt.Errorf("tags: %q is not a tag ([A-Za-z0-9_.-], starting with a letter, digit or _): %w", clip(t, 140), errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

func (s *Server) tagger() (tagger, error) {
	t, ok := s.place.(tagger)
	if !ok {
		return nil, fmt.Errorf("template tags are kept with template builds, on a host: this server places sandboxes on Kubernetes: %w", errdefs.ErrNotImplemented)
	}
	return t, nil
}

// assignTags is POST /templates/tags: {target: "NAME:TAG", tags}.
func (s *Server) assignTags(r *http.Request, tenantName string) (int, any, error) {
	tg, err := s.tagger()
	if err != nil {
		return 0, nil, err
	}
	var body struct {
		Target string   `json:"target"`
		Tags   []string `json:"tags"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	if body.Target == "" {
		return 0, nil, fmt.Errorf("target: name the build to tag as NAME:TAG: %w", errdefs.ErrInvalidArgument)
	}
	id, from, err := templateName(body.Target)
	if err != nil {
		return 0, nil, fmt.Errorf("target: %w", err)
	}
	if err := checkTags(body.Tags); err != nil {
		return 0, nil, err
	}
	buildID, err := tg.tagTemplate(r.Context(), tenantName, id, from, body.Tags)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, map[string]any{"buildID": buildID, "tags": body.Tags}, nil
}

// deleteTags is DELETE /templates/tags: {name, tags}.
func (s *Server) deleteTags(r *http.Request, tenantName string) (int, any, error) {
	tg, err := s.tagger()
	if err != nil {
		return 0, nil, err
	}
	var body struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	if err := checkTemplateID(body.Name); err != nil || strings.Contains(body.Name, ":") {
		return 0, nil, fmt.Errorf("name %q: want a template's name, without a tag: %w", clip(body.Name, 140), errdefs.ErrInvalidArgument)
	}
	if err := checkTags(body.Tags); err != nil {
		return 0, nil, err
	}
	if err := tg.untagTemplate(context.WithoutCancel(r.Context()), tenantName, body.Name, body.Tags); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

// templateSub is GET /templates/{templateID}/{sub}, which holds two of
// E2B's calls whose paths overlap: /templates/aliases/{alias}
// (templateAlias) and /templates/{templateID}/tags (listTags).
func (s *Server) templateSub(r *http.Request, tenantName string) (int, any, error) {
	switch {
	case r.PathValue("templateID") == "aliases":
		return s.templateAlias(r, tenantName, r.PathValue("sub"))
	case r.PathValue("sub") == "tags":
		return s.listTags(r, tenantName)
	}
	return 0, nil, fmt.Errorf("no such call: %w", errdefs.ErrNotFound)
}

// listTags is GET /templates/{templateID}/tags.
func (s *Server) listTags(r *http.Request, tenantName string) (int, any, error) {
	tg, err := s.tagger()
	if err != nil {
		return 0, nil, err
	}
	id := r.PathValue("templateID")
	if err := checkTemplateID(id); err != nil || strings.Contains(id, ":") {
		return 0, nil, fmt.Errorf("templateID %q: want a template's name, without a tag: %w", clip(id, 140), errdefs.ErrInvalidArgument)
	}
	tags, err := tg.templateTags(r.Context(), tenantName, id)
	if err != nil {
		return 0, nil, err
	}
	sort.Slice(tags, func(i, j int) bool { return tags[i].Tag < tags[j].Tag })
	return http.StatusOK, tags, nil
}
