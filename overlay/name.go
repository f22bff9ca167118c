package overlay

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/containerd/errdefs"
)

const (
	// DefaultTag is the tag ParseName adds to a name without one.
	DefaultTag = "latest"

	maxRepoLen = 255
)

var (
	// pathComponent is one '/'-separated part of a repository name, as in
	// the distribution reference grammar.
	pathComponent = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$`)
	tagPattern    = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
	hostPattern   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]+)?$`)
	leasePattern  = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$`)
)

// ParseName validates and normalizes an image name.
//
// A name is a repository of lowercase [a-z0-9] components, separated within a
// component by '.', '_', '__' or dashes and between components by '/' (at most
// 255 characters), with an optional ":tag" matching
// [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}. The result always carries a tag:
// "base" becomes "base:latest". Digests ("@sha256:...") and registry hosts
// (a first component with a '.', a ':port' or "localhost" followed by '/') are
// rejected: images come from local builds and archives only.
//
// Errors name the bad input and wrap errdefs.ErrInvalidArgument.
func ParseName(s string) (string, error) {
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("invalid image name %q: %s: %w", s, why, errdefs.ErrInvalidArgument)
	}
	if s == "" {
		return bad("empty")
	}
	if strings.Contains(s, "@") {
		return bad("digest references are not supported")
	}
	repo, tag := s, DefaultTag
	if i := strings.LastIndexByte(s, ':'); i > strings.LastIndexByte(s, '/') {
		repo, tag = s[:i], s[i+1:]
		if !tagPattern.MatchString(tag) {
			return bad("tag must match [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
		}
	}
	if repo == "" {
		return bad("empty repository")
	}
	components := strings.Split(repo, "/")
	if first := components[0]; len(components) > 1 && hostPattern.MatchString(first) &&
		(strings.ContainsAny(first, ".:") || first == "localhost") {
		return bad(fmt.Sprintf("registries are not supported (%q looks like a registry host)", first))
	}
	if len(repo) > maxRepoLen {
		return bad(fmt.Sprintf("repository longer than %d characters", maxRepoLen))
	}
	for _, c := range components {
		if !pathComponent.MatchString(c) {
			if strings.ToLower(c) != c {
				return bad("repository must be lowercase")
			}
			return bad(fmt.Sprintf("component %q must be [a-z0-9] separated by '.', '_' or '-'", c))
		}
	}
	return repo + ":" + tag, nil
}

// validLeaseID reports whether id can name a lease (a sandbox ID).
func validLeaseID(id string) error {
	if !leasePattern.MatchString(id) {
		return fmt.Errorf("invalid lease ID %q: must match %s: %w", id, leasePattern, errdefs.ErrInvalidArgument)
	}
	return nil
}
