package serve

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/moby/buildkit/client"

	"hutch.dev/hutch/engine"
)

var _ builder = (*hostPlacement)(nil)

// labelBuild marks an image a template build made (with its build ID),
// so that it is listed as a template and not as a snapshot.
const labelBuild = "dev.hutch.serve.build"

// baseImage is the FROM of a tenant's build: fromTemplate is the
// tenant's own template or a shared image (base: the default image);
// fromImage is an image reference, e2bdev/base (the SDKs' default)
// being the default image here.
func (h *hostPlacement) baseImage(ctx context.Context, tenantName, from string, template bool) (string, error) {
	if !template && (from == "e2bdev/base" || from == "e2bdev/base:latest") {
		from = engine.DefaultImage
	}
	if template {
		if err := checkTemplateID(from); err != nil {
			return "", fmt.Errorf("fromTemplate: %w", err)
		}
	}
	name, err := h.templateImage(ctx, tenantName, from)
	if err != nil {
		return "", fmt.Errorf("from %s: %w", from, err)
	}
	if _, err := h.eng.Image(ctx, name); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return "", fmt.Errorf("from %s: the image is not on this host yet (the default image is built by the first create of it; others: hutch image pull or build): %w", from, errdefs.ErrNotFound)
		}
		return "", err
	}
	return name, nil
}

func (h *hostPlacement) imageUser(ctx context.Context, tenantName, name string) (string, error) {
	img, err := h.eng.Image(ctx, name)
	if err != nil {
		return "", err
	}
	return img.Config.Config.User, nil
}

// buildTemplate builds dir with BuildKit into b's image, its progress in
// b's log, and then, for a start command, its warm checkpoint. A failed
// step names its Dockerfile instruction; a template that never gets
// ready leaves no image.
func (h *hostPlacement) buildTemplate(ctx context.Context, b *build, dir string) error {
	labels := b.labels
	ch := make(chan *client.SolveStatus)
	failed := make(chan int, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		seen := map[string]bool{}
		partial := map[string]string{}
		bad := 0
		for st := range ch {
			for _, v := range st.Vertexes {
				n := 0
				if m := vertexStep.FindStringSubmatch(v.Name); m != nil {
					fmt.Sscan(m[1], &n)
				}
				if v.Started != nil && !seen[v.Digest.String()] {
					seen[v.Digest.String()] = true
					b.log("info", b.stepOf(n), v.Name)
				}
				if v.Error != "" && bad == 0 && n > 0 {
					bad = n
				}
			}
			for _, l := range st.Logs {
				// A step's output comes in chunks that may end
				// inside a line: an entry is a whole line.
				k := l.Vertex.String()
				data := partial[k] + string(l.Data)
				lines := strings.Split(data, "\n")
				partial[k] = lines[len(lines)-1]
				for _, line := range lines[:len(lines)-1] {
					b.log("info", "", line)
				}
			}
		}
		for _, rest := range partial {
			if rest != "" {
				b.log("info", "", rest)
			}
		}
		failed <- bad
	}()
	_, err := h.eng.Build(ctx, engine.BuildRequest{
		ContextDir: dir, Tag: b.image, Labels: labels, Status: ch, Allow: h.buildAllow, DNS: h.buildDNS,
	})
	<-done
	if n := <-failed; err != nil {
		if n > 0 {
			return &stepError{instruction: n, err: err}
		}
		return err
	}
	if labels[engine.LabelStart] == "" {
		return nil
	}
	b.log("info", "finalize", "starting the start command until it is ready, to capture it with memory")
	if _, err := h.eng.BuildTemplate(ctx, b.image); err != nil {
		if rerr := h.eng.RemoveImage(context.WithoutCancel(ctx), b.image); rerr != nil {
			err = fmt.Errorf("%w (and removing the image: %v)", err, rerr)
		}
		return &stepError{instruction: len(b.steps), err: err}
	}
	return nil
}
