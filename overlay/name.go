package overlay

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
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
	// tagPattern and leasePattern leave the length (at most 128) to their
	// callers: a bounded repetition is a large compile at every start.
	tagPattern   = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*$`)
	hostPattern  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]+)?$`)
	leasePattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)
)

// ParseName validates and normalizes an image name.
//
// A local name is a repository of lowercase [a-z0-9] components, separated
// within a component by '.', '_', '__' or dashes and between components by
// '/' (at most 255 characters), with an optional ":tag" matching
// [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}. The result always carries a tag:
// "base" becomes "base:latest".
//
// A name whose first component is a registry host (it has a '.', a ':port'
// or is "localhost", and a '/' follows), or that carries an "@sha256:"
// digest, is a registry reference: it is normalized as docker does
// ("docker.io/python" becomes "docker.io/library/python:latest"; a digest
// replaces the tag). Pulled images keep that full reference as their name.
//
// Errors name the bad input and wrap errdefs.ErrInvalidArgument.
func ParseName(s string) (string, error) {
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("invalid image name %q: %s: %w", s, why, errdefs.ErrInvalidArgument)
	}
	if s == "" {
		return bad("empty")
	}
	if strings.Contains(s, "@") || hasRegistryHost(s) {
		return RegistryName(s)
	}
	repo, tag := s, DefaultTag
	if i := strings.LastIndexByte(s, ':'); i > strings.LastIndexByte(s, '/') {
		repo, tag = s[:i], s[i+1:]
		if len(tag) > 128 || !tagPattern.MatchString(tag) {
			return bad("tag must match [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
		}
	}
	if repo == "" {
		return bad("empty repository")
	}
	if len(repo) > maxRepoLen {
		return bad(fmt.Sprintf("repository longer than %d characters", maxRepoLen))
	}
	for _, c := range strings.Split(repo, "/") {
		if !pathComponent.MatchString(c) {
			if strings.ToLower(c) != c {
				return bad("repository must be lowercase")
			}
			return bad(fmt.Sprintf("component %q must be [a-z0-9] separated by '.', '_' or '-'", c))
		}
	}
	return repo + ":" + tag, nil
}

// hasRegistryHost reports whether s starts with a registry host: a first
// '/'-separated component with a '.' or a ':port', or "localhost".
func hasRegistryHost(s string) bool {
	i := strings.IndexByte(s, '/')
	if i <= 0 {
		return false
	}
	first := s[:i]
	return hostPattern.MatchString(first) && (strings.ContainsAny(first, ".:") || first == "localhost") ||
		strings.HasPrefix(first, "[") // an IPv6 address
}

// RegistryName is s as a fully qualified registry reference, the way docker
// reads it: "python:3.12" is "docker.io/library/python:3.12",
// "ghcr.io/o/r" is "ghcr.io/o/r:latest", and a digest
// ("...@sha256:<hex>") replaces any tag. Errors wrap
// errdefs.ErrInvalidArgument.
func RegistryName(s string) (string, error) {
	named, err := reference.ParseDockerRef(s)
	if err != nil {
		return "", fmt.Errorf("invalid image reference %q: %v: %w", s, err, errdefs.ErrInvalidArgument)
	}
	return named.String(), nil
}

// validLeaseID reports whether id can name a lease (a sandbox ID).
func validLeaseID(id string) error {
	if len(id) > 128 || !leasePattern.MatchString(id) {
		return fmt.Errorf("invalid lease ID %q: must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$: %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}
