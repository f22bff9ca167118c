package serve

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/overlay"
)

var _ tagger = (*hostPlacement)(nil)

// buildIDOf is the ID of the build that made img: its labelBuild, or for
// an image no template build made (a snapshot), its digest's start.
func buildIDOf(img overlay.Image) string {
	if id := img.Config.Config.Labels[labelBuild]; id != "" {
		return id
	}
	return img.Digest.Encoded()[:12]
}

func (h *hostPlacement) tagTemplate(ctx context.Context, tenantName, id, from string, tags []string) (string, error) {
	src := tenantImage(tenantName, id+":"+from)
	img, err := h.eng.Images().Get(ctx, src)
	if errors.Is(err, errdefs.ErrNotFound) {
		return "", fmt.Errorf("template %s:%s not found: %w", id, from, errdefs.ErrNotFound)
	}
	if err != nil {
		return "", err
	}
	for _, t := range tags {
		if t == from {
			continue
		}
		if _, err := h.eng.Images().Tag(ctx, src, tenantImage(tenantName, id+":"+t)); err != nil {
			return "", err
		}
	}
	return buildIDOf(img), nil
}

func (h *hostPlacement) untagTemplate(ctx context.Context, tenantName, id string, tags []string) error {
	for _, t := range tags {
		if _, err := h.eng.Images().Get(ctx, tenantImage(tenantName, id+":"+t)); err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				return fmt.Errorf("template %s has no tag %q: %w", id, t, errdefs.ErrNotFound)
			}
			return err
		}
	}
	for _, t := range tags {
		if err := h.eng.RemoveImage(ctx, tenantImage(tenantName, id+":"+t)); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return err
		}
	}
	return nil
}

func (h *hostPlacement) templateTags(ctx context.Context, tenantName, id string) ([]templateTag, error) {
	all, err := h.eng.Images().List(ctx)
	if err != nil {
		return nil, err
	}
	prefix := tenantImage(tenantName, id+":")
	out := []templateTag{}
	for _, img := range all {
		tag, ok := strings.CutPrefix(img.Name, prefix)
		if !ok {
			continue
		}
		at := img.Tagged
		if at.IsZero() {
			at = img.Created
		}
		out = append(out, templateTag{Tag: tag, BuildID: buildIDOf(img), CreatedAt: at.UTC()})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("template %q not found: %w", id, errdefs.ErrNotFound)
	}
	return out, nil
}
