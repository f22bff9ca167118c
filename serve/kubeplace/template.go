package kubeplace

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/kube"
)

// templateLog is where a pod's template start command writes its output:
// pods have no sandbox log.
const templateLog = "/tmp/.hutch-template-start.log"

// startTemplate starts t's command in sandbox id's pod, detached (its
// shell is the agent's child once the exec ends), and waits for its
// ready check: a template on Kubernetes starts cold. The exec has no
// terminal, so nothing hangs the command up when it ends.
func (k *Placement) startTemplate(ctx context.Context, id string, t *engine.Template) error {
	p := kubeProbe{k: k, id: id}
	code, out, err := p.Run(ctx, []string{"/bin/sh", "-c", `/bin/sh -c "$1" >` + templateLog + ` 2>&1 </dev/null &`, "sh", t.Start})
	if err != nil {
		return err
	}
	if code != 0 {
		return errors.New("start command: exit status " + strconv.Itoa(code) + ": " + out)
	}
	return engine.WaitReady(ctx, p, t)
}

// kubeProbe runs a template's ready check in a pod.
type kubeProbe struct {
	k  *Placement
	id string
}

func (p kubeProbe) Run(ctx context.Context, args []string) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var out bytes.Buffer
	code, err := p.k.exec(ctx, kube.ExecRequest{
		Namespace: p.k.cfg.Namespace, Pod: kubePodName(p.id), Container: kubeContainer,
		Args: args, Stdout: &limitedBuffer{b: &out, n: 8192}, Stderr: &limitedBuffer{b: &out, n: 8192},
	})
	return code, out.String(), err
}

// Dial reaches the port through the agent's endpoint. A pod without
// network has none: the port is then probed from inside (bash's
// /dev/tcp, else nc), and a connection that works is reported as a
// closed one, which serves a port check and no URL check.
func (p kubeProbe) Dial(ctx context.Context, port uint16) (net.Conn, error) {
	c, err := p.k.DialPort(ctx, p.id, port)
	if !errors.Is(err, errdefs.ErrNotImplemented) {
		return c, err
	}
	code, out, err := p.Run(ctx, []string{"/bin/sh", "-c", `if command -v bash >/dev/null; then exec bash -c 'exec 3<>/dev/tcp/127.0.0.1/'"$1"; else exec nc -w 2 127.0.0.1 "$1" </dev/null; fi`, "sh", strconv.Itoa(int(port))})
	if err != nil {
		return nil, err
	}
	if code != 0 {
		return nil, errors.New("nothing listens on port " + strconv.Itoa(int(port)) + ": " + out)
	}
	c1, c2 := net.Pipe()
	c2.Close()
	return c1, nil
}

func (p kubeProbe) Log(ctx context.Context) string {
	_, out, _ := p.Run(context.WithoutCancel(ctx), []string{"/bin/sh", "-c", "tail -c 4096 " + templateLog})
	return out
}
