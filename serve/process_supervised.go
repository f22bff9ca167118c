package serve

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/encoding/protojson"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/envdpb/processpb"
	"hutch.dev/hutch/serve/placement"
)

// Commands without a terminal run through the sandbox's supervisor
// (engine.Supervisor): they survive pause and resume, and after either,
// or after a restart of the server, List and Connect find them again.

// engineSupervisor is an engine.Supervisor as a placement.Supervisor.
type engineSupervisor struct{ sv *engine.Supervisor }

func (e engineSupervisor) Start(ctx context.Context, req engine.ExecRequest, meta []byte) (placement.Command, error) {
	c, err := e.sv.Start(ctx, req, meta)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (e engineSupervisor) Attach(ctx context.Context, pid int, req engine.AttachRequest) (placement.Command, error) {
	c, err := e.sv.Attach(ctx, pid, req)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (e engineSupervisor) List(ctx context.Context) ([]engine.SupervisedProcess, error) {
	return e.sv.List(ctx)
}

func (e engineSupervisor) Close() { e.sv.Close() }

// procMeta is what the service keeps with a supervised command, to list
// and follow it after a resume or a restart.
type procMeta struct {
	Tag    *string         `json:"tag,omitempty"`
	Config json.RawMessage `json:"config"`
	Stdin  bool            `json:"stdin,omitempty"`
	// Pty says that the command runs on a terminal.
	Pty bool `json:"pty,omitempty"`
}

// metaOf encodes a supervised command's metadata: its config without
// the environment, or without its arguments too, if it would not fit.
func metaOf(tag *string, cfg *processpb.ProcessConfig, stdin, pty bool) []byte {
	for _, c := range []*processpb.ProcessConfig{
		cfg,
		{Cmd: cfg.GetCmd(), Args: cfg.GetArgs(), Cwd: cfg.Cwd},
		{Cmd: cfg.GetCmd(), Cwd: cfg.Cwd},
	} {
		raw, err := protojson.Marshal(c)
		if err != nil {
			continue
		}
		b, err := json.Marshal(procMeta{Tag: tag, Config: raw, Stdin: stdin, Pty: pty})
		if err == nil && len(b) <= maxMeta {
			return b
		}
	}
	b, _ := json.Marshal(procMeta{Tag: tag, Config: json.RawMessage("{}"), Stdin: stdin, Pty: pty})
	return b
}

// maxMeta is the most metadata a supervised command takes.
const maxMeta = 16 << 10

// adopt attaches to the running supervised commands of sandbox id that
// this service started and its table does not know: the one sel names,
// or all with sel nil. It returns the one sel names, if found. Failures
// are logged: the sandbox may not run, or have no agent.
func (s *processService) adopt(ctx context.Context, id string, sel *processpb.ProcessSelector) *proc {
	t := s.table(id)
	sv, err := t.supervisor(s, id)
	if err != nil {
		slog.Debug("no supervisor to find processes", "sandbox", id, "err", err)
		return nil
	}
	t.adoptMu.Lock()
	defer t.adoptMu.Unlock()
	list, err := sv.List(ctx)
	if err != nil {
		slog.Debug("list supervised processes", "sandbox", id, "err", err)
		return nil
	}
	var found *proc
	for _, sp := range list {
		var m procMeta
		if !sp.Running || sp.Pid <= 0 || json.Unmarshal(sp.Meta, &m) != nil || m.Config == nil {
			continue
		}
		pid := uint32(sp.Pid)
		switch v := sel.GetSelector().(type) {
		case *processpb.ProcessSelector_Pid:
			if pid != v.Pid {
				continue
			}
		case *processpb.ProcessSelector_Tag:
			if m.Tag == nil || *m.Tag != v.Tag || (found != nil && found.pid < pid) {
				continue
			}
		}
		t.mu.Lock()
		known := t.procs[pid]
		t.mu.Unlock()
		if known != nil {
			if sel != nil {
				found = known
			}
			continue
		}
		cfg := &processpb.ProcessConfig{}
		if err := protojson.Unmarshal(m.Config, cfg); err != nil {
			continue
		}
		p := &proc{pid: pid, tag: m.Tag, config: cfg, tty: m.Pty, hub: newHub(s.grace)}
		var stdinR *os.File
		if m.Stdin {
			if stdinR, p.stdin, err = os.Pipe(); err != nil {
				continue
			}
		}
		areq := engine.AttachRequest{Stdout: hubWriter{p.hub, outStdout}, Stderr: hubWriter{p.hub, outStderr}}
		if p.tty {
			areq = engine.AttachRequest{Stdout: hubWriter{p.hub, outPty}, Stderr: hubWriter{p.hub, outPty}, TTY: true}
		}
		if stdinR != nil {
			areq.Stdin = stdinR
		}
		cmd, err := sv.Attach(ctx, sp.Pid, areq)
		if err != nil {
			p.closeStdin()
			if stdinR != nil {
				stdinR.Close()
			}
			if !errors.Is(err, errdefs.ErrNotFound) {
				slog.Debug("attach to a supervised process", "sandbox", id, "pid", pid, "err", err)
			}
			continue
		}
		p.cmd = cmd
		t.mu.Lock()
		t.procs[pid] = p
		t.mu.Unlock()
		go s.reap(t, p, stdinR)
		if sel != nil {
			found = p
		}
	}
	return found
}
