package buildimg

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
	"github.com/moby/buildkit/client"
	"github.com/moby/buildkit/exporter/containerimage/exptypes"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/tonistiigi/fsutil"

	"hutch.dev/hutch/overlay"
)

// storeID names hutch's store among the build session's OCI stores.
const storeID = "hutch"

// Options describe one Dockerfile build.
type Options struct {
	// ContextDir is the build context, a directory.
	ContextDir string
	// Dockerfile is the Dockerfile's path; empty means ContextDir/Dockerfile.
	Dockerfile string
	// Tag names the result in the store. Empty builds without storing
	// anything: the result stays only in BuildKit's cache.
	Tag string
	// BuildArgs are the Dockerfile's ARG values.
	BuildArgs map[string]string
	// Labels are set on the image, over the Dockerfile's LABELs.
	Labels map[string]string
	// Status, if set, receives BuildKit's progress; Build closes it.
	Status chan *client.SolveStatus
	// Image, if set, finds the images FROM names, putting them in the
	// store (e.g. from a shared store, or building the default image);
	// nil: the store's Get.
	Image func(ctx context.Context, name string) (overlay.Image, error)
}

// Builder builds Dockerfiles into a hutch image store.
type Builder struct {
	// Store is where FROM images come from and results go.
	Store *overlay.Store
	// Daemon is the buildkitd hutch runs; used when Addr is empty.
	Daemon *Daemon
	// Addr is an existing buildkitd's address (e.g. unix:///run/buildkit/buildkitd.sock).
	Addr string
}

// Build builds o's Dockerfile and, with o.Tag, tags the result in the
// store. Bad input (a missing context or Dockerfile, a syntax error, a FROM
// image that is not in the store, a bad tag) fails before any build starts,
// with an error wrapping errdefs.ErrInvalidArgument or ErrNotFound. On any
// error nothing is tagged.
func (b *Builder) Build(ctx context.Context, o Options) (img overlay.Image, err error) {
	status := o.Status
	defer func() {
		if status != nil {
			close(status)
		}
	}()
	if o.Tag != "" {
		if o.Tag, err = overlay.ParseName(o.Tag); err != nil {
			return img, err
		}
	}
	p, err := b.prepare(ctx, o)
	if err != nil {
		return img, err
	}
	addr := b.Addr
	var opts []client.ClientOpt
	if addr == "" {
		release, err := b.Daemon.Acquire(ctx)
		if err != nil {
			return img, err
		}
		defer release()
		addr = b.Daemon.Addr()
		opts = append(opts, client.WithContextDialer(b.Daemon.Dial))
	}
	cs, releaseStore, err := b.Store.Content()
	if err != nil {
		return img, err
	}
	defer releaseStore()

	c, err := client.New(ctx, addr, opts...)
	if err != nil {
		return img, fmt.Errorf("connect to buildkitd at %s: %w", addr, err)
	}
	defer c.Close()
	opt := client.SolveOpt{
		Frontend:      "dockerfile.v0",
		FrontendAttrs: p.attrs,
		LocalMounts:   map[string]fsutil.FS{"context": p.contextFS, "dockerfile": p.dockerfileFS},
		OCIStores:     map[string]content.Store{storeID: cs},
	}
	if o.Tag != "" {
		opt.Exports = []client.ExportEntry{{
			Type:        client.ExporterOCI,
			Attrs:       map[string]string{"tar": "false", "name": o.Tag},
			OutputStore: cs,
		}}
	}
	ch := status
	status = nil // Solve closes it
	if ch == nil {
		ch = make(chan *client.SolveStatus)
		go func() {
			for range ch {
			}
		}()
	}
	resp, err := c.Solve(ctx, nil, opt, ch)
	if err != nil {
		if ctx.Err() != nil {
			return img, fmt.Errorf("build interrupted: %w", ctx.Err())
		}
		return img, fmt.Errorf("build: %s", oneLine(err))
	}
	if o.Tag == "" {
		return img, nil
	}
	enc := resp.ExporterResponse[exptypes.ExporterImageDescriptorKey]
	raw, err := base64.StdEncoding.DecodeString(enc)
	if err != nil || enc == "" {
		return img, fmt.Errorf("build: buildkitd returned no image descriptor")
	}
	var desc ocispec.Descriptor
	if err := json.Unmarshal(raw, &desc); err != nil {
		return img, fmt.Errorf("build: image descriptor: %w", err)
	}
	return b.Store.TagManifest(ctx, o.Tag, desc)
}

// prepared is a build's checked input.
type prepared struct {
	attrs                   map[string]string
	contextFS, dockerfileFS fsutil.FS
}

// prepare checks o and renders the frontend's attributes: build args,
// the Dockerfile's name and one named context per store image it uses.
func (b *Builder) prepare(ctx context.Context, o Options) (*prepared, error) {
	if fi, err := os.Stat(o.ContextDir); err != nil {
		return nil, fmt.Errorf("build context %q: %w", o.ContextDir, notExist(err))
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("build context %q is not a directory: %w", o.ContextDir, errdefs.ErrInvalidArgument)
	}
	df := o.Dockerfile
	if df == "" {
		df = filepath.Join(o.ContextDir, "Dockerfile")
	}
	src, err := os.ReadFile(df)
	if err != nil {
		return nil, fmt.Errorf("Dockerfile %q: %w", df, notExist(err))
	}
	refs, err := imageRefs(src, o.BuildArgs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", df, err)
	}
	attrs := map[string]string{"filename": filepath.Base(df)}
	for k, v := range o.BuildArgs {
		attrs["build-arg:"+k] = v
	}
	for k, v := range o.Labels {
		attrs["label:"+k] = v
	}
	if _, ok := o.BuildArgs["SOURCE_DATE_EPOCH"]; !ok {
		// Equal input gives an equal image: no build time in the config.
		attrs["build-arg:SOURCE_DATE_EPOCH"] = "0"
	}
	get := b.Store.Get
	if o.Image != nil {
		get = o.Image
	}
	for _, r := range refs {
		if r.name == "" {
			continue
		}
		img, err := get(ctx, r.name)
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("%s:%d: image %q is not in hutch's store (pull it first: hutch image pull %s): %w",
				df, r.line, r.name, r.name, errdefs.ErrNotFound)
		}
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", df, r.line, err)
		}
		attrs["context:"+familiar(img.Name)] = "oci-layout://" + storeID + "@" + img.Digest.String()
	}
	if p, ok := attrs["context:"]; ok {
		return nil, fmt.Errorf("bad context %q", p)
	}
	ctxFS, err := fsutil.NewFS(o.ContextDir)
	if err != nil {
		return nil, err
	}
	dfFS, err := fsutil.NewFS(filepath.Dir(df))
	if err != nil {
		return nil, err
	}
	return &prepared{attrs: attrs, contextFS: ctxFS, dockerfileFS: dfFS}, nil
}

// imageRef is an image a Dockerfile uses, by normalized name ("" for
// scratch), with the line that names it.
type imageRef struct {
	name string
	line int
}

// imageRefs parses a Dockerfile with BuildKit's own parser and returns the
// images its FROM and COPY --from instructions name, other than earlier
// stages. Names are expanded with the meta ARGs and args.
func imageRefs(src []byte, args map[string]string) ([]imageRef, error) {
	res, err := parser.Parse(bytes.NewReader(src))
	if err != nil {
		return nil, err
	}
	stages, metaArgs, err := instructions.Parse(res.AST, nil)
	if err != nil {
		return nil, err
	}
	var env []string
	for _, a := range metaArgs {
		for _, kv := range a.Args {
			if v, ok := args[kv.Key]; ok {
				env = append(env, kv.Key+"="+v)
			} else if kv.Value != nil {
				env = append(env, kv.Key+"="+*kv.Value)
			}
		}
	}
	lex := shell.NewLex(res.EscapeToken)
	expand := func(s string) (string, error) {
		out, _, err := lex.ProcessWord(s, shell.EnvsFromSlice(env))
		return out, err
	}
	seen := map[string]bool{}
	var refs []imageRef
	add := func(raw string, line int) error {
		n, err := expand(raw)
		if err != nil {
			return fmt.Errorf("line %d: %q: %w", line, raw, err)
		}
		if n == "" || strings.EqualFold(n, "scratch") || seen[strings.ToLower(n)] {
			return nil
		}
		norm, err := overlay.ParseName(n)
		if err != nil {
			return fmt.Errorf("line %d: %w", line, err)
		}
		refs = append(refs, imageRef{name: norm, line: line})
		return nil
	}
	for i, st := range stages {
		line := 0
		if len(st.Location) > 0 {
			line = st.Location[0].Start.Line
		}
		if err := add(st.BaseName, line); err != nil {
			return nil, err
		}
		for _, c := range st.Commands {
			cp, ok := c.(*instructions.CopyCommand)
			if !ok || cp.From == "" {
				continue
			}
			if _, err := fmt.Sscanf(cp.From, "%d", new(int)); err == nil {
				continue // a stage index
			}
			l := 0
			if loc := cp.Location(); len(loc) > 0 {
				l = loc[0].Start.Line
			}
			if err := add(cp.From, l); err != nil {
				return nil, err
			}
		}
		seen[strings.ToLower(st.Name)] = true
		seen[fmt.Sprint(i)] = true
	}
	return refs, nil
}

// familiar is how BuildKit's dockerfile frontend keys a named context: the
// familiar form of the name (docker.io/library/python:3.12 is
// python:3.12) without ":latest".
func familiar(name string) string {
	if named, err := reference.ParseNormalizedNamed(name); err == nil {
		name = reference.FamiliarString(named)
	}
	return strings.TrimSuffix(name, ":"+overlay.DefaultTag)
}

func notExist(err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return errdefs.ErrNotFound
	}
	return err
}

// oneLine is err's message on one line: BuildKit's errors may carry the
// failing step's output.
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", " ")), " ")
}
