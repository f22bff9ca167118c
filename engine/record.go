package engine

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"time"

	"github.com/opencontainers/go-digest"
)

// Sandbox is what the engine reports about one sandbox: what List, Get,
// Create and the other verbs return, and what `hutch inspect` prints. It
// carries no host PIDs and no host paths of the engine's own; the
// on-disk record behind it (Record) does, for debugging.
type Sandbox struct {
	ID          string        `json:"id"`
	Name        string        `json:"name,omitempty"`
	Image       string        `json:"image"`
	ImageDigest digest.Digest `json:"imageDigest"`
	// ImageUser is the image's user, the default of every exec.
	ImageUser string    `json:"imageUser,omitempty"`
	Created   time.Time `json:"created"`
	// State is one of the State constants, computed when read.
	State  string  `json:"state"`
	CPUs   float64 `json:"cpus"`
	Memory int64   `json:"memory"`
	Pids   int64   `json:"pids"`
	Disk   int64   `json:"disk"`
	// Network is the network mode (none, allow or open); Allow the
	// destinations an allow sandbox reaches; DNS its resolver's upstreams.
	Network string   `json:"network"`
	Allow   []string `json:"allow,omitempty"`
	DNS     []string `json:"dns,omitempty"`
	// NetRate limits what the sandbox sends, in bits per second.
	NetRate int64 `json:"netRate,omitempty"`
	// Docker: the sandbox runs a Docker daemon of its own, with what
	// that needs (docs/docker.md).
	Docker bool `json:"docker,omitempty"`
	// IP is the sandbox's address on its network link.
	IP       string            `json:"ip,omitempty"`
	Env      []string          `json:"env,omitempty"`
	Workdir  string            `json:"workdir"`
	Labels   map[string]string `json:"labels,omitempty"`
	Rootless bool              `json:"rootless"`
	// UnenforcedLimits names the limits (cpus, memory) this rootless
	// sandbox has without their being enforced: the host gives its user
	// no cgroup for them (Engine.Limits).
	UnenforcedLimits []string `json:"unenforced_limits,omitempty"`
	// Mounts are the host directories and named volumes mounted into the
	// sandbox, as the create asked for them.
	Mounts []Mount `json:"mounts,omitempty"`
	// Ports are the published ports, with the host ports they got.
	Ports []PortMapping `json:"ports,omitempty"`
	// Secrets are the names of the sandbox's secrets; their values are
	// only inside the sandbox (docs/security.md).
	Secrets []string `json:"secrets,omitempty"`
	// Inject are the sandbox's inject rules, as given (their values
	// name secrets of the host's store; never a value).
	Inject []string `json:"inject,omitempty"`
	// CACerts are the certificates the sandbox trusts besides its
	// image's: subject and SHA-256.
	CACerts []string `json:"caCerts,omitempty"`
	// OOMKilled: the host's OOM killer ended the sandbox when it reached
	// its memory limit.
	OOMKilled bool `json:"oomKilled,omitempty"`
	// OneShot: the sandbox's init is one command (Run) and the sandbox
	// stops with it.
	OneShot bool `json:"oneShot,omitempty"`

	// ForkedFrom is the sandbox this one was forked from.
	ForkedFrom string `json:"forkedFrom,omitempty"`
	// Template says how a sandbox of a template image began: restored
	// from the template's checkpoint (Warm), or booted cold with its
	// start command, and why (Reason).
	Template *TemplateStart `json:"template,omitempty"`
	// Checkpoint is the memory checkpoint of a paused sandbox, in the
	// image store.
	Checkpoint digest.Digest `json:"checkpoint,omitempty"`
	// CheckpointHead is the checkpoint of its tree the sandbox is at
	// (the last one taken or restored).
	CheckpointHead string `json:"checkpointHead,omitempty"`
	// ForkedFromCheckpoint is the checkpoint a fork was made from.
	ForkedFromCheckpoint string `json:"forkedFromCheckpoint,omitempty"`
	// Setup are the --setup commands of the create; SetupCache says
	// whether they ran ("ran", cached as SetupImage) or the sandbox
	// started from the cache ("hit").
	Setup      []string `json:"setup,omitempty"`
	SetupCache string   `json:"setupCache,omitempty"`
	SetupImage string   `json:"setupImage,omitempty"`
	// Timeout is the sandbox's lifetime (a Go duration); when Deadline
	// passes, OnTimeout happens ("pause", "stop" or "rm").
	Timeout   string     `json:"timeout,omitempty"`
	OnTimeout string     `json:"onTimeout,omitempty"`
	Deadline  *time.Time `json:"deadline,omitempty"`

	// creatorPid is the process whose create or fork is still making the
	// sandbox (0 once made).
	creatorPid int
}

// ShortID is the 12-character form of the ID.
func (s *Sandbox) ShortID() string { return shortID(s.ID) }

// Abandoned reports whether the create or fork that was making the
// sandbox ended before finishing it: the sandbox may run, but nothing
// will hand it to anyone. Remove cleans it up.
func (s *Sandbox) Abandoned() bool {
	if s.creatorPid == 0 {
		return false
	}
	return s.State == StateStopped || !processAlive(s.creatorPid)
}

// CreatingHere reports whether a create or fork in this process is still
// making the sandbox.
func (s *Sandbox) CreatingHere() bool {
	return s.creatorPid != 0 && s.creatorPid == os.Getpid()
}

// view is the record as callers outside the engine see it: copies of its
// lists, none of its host PIDs and paths. A nil record has a nil view.
func (r *record) view() *Sandbox {
	if r == nil {
		return nil
	}
	var labels map[string]string
	if r.Labels != nil {
		labels = make(map[string]string, len(r.Labels))
		for k, v := range r.Labels {
			labels[k] = v
		}
	}
	var deadline *time.Time
	if r.Deadline != nil {
		d := *r.Deadline
		deadline = &d
	}
	return &Sandbox{
		ID: r.ID, Name: r.Name, Image: r.Image, ImageDigest: r.ImageDigest,
		ImageUser: r.ImageUser, Created: r.Created, State: r.State,
		CPUs: r.CPUs, Memory: r.Memory, Pids: r.Pids, Disk: r.Disk,
		Network: r.Network, Allow: slices.Clone(r.Allow), DNS: slices.Clone(r.DNS), NetRate: r.NetRate,
		Docker: r.Docker, IP: r.IP, Env: slices.Clone(r.Env), Workdir: r.Workdir, Labels: labels,
		Rootless: r.Rootless, UnenforcedLimits: slices.Clone(r.Unenforced),
		Mounts: slices.Clone(r.Mounts), Ports: slices.Clone(r.Ports),
		Secrets: slices.Clone(r.Secrets), CACerts: slices.Clone(r.CACerts), Inject: injectViews(r.Inject),
		OOMKilled: r.OOMKilled, OneShot: r.OneShot,
		ForkedFrom: r.ForkedFrom, Template: cloneTemplateStart(r.Template), Checkpoint: r.Checkpoint,
		CheckpointHead: r.CheckpointHead, ForkedFromCheckpoint: r.ForkedFromCheckpoint,
		Setup: slices.Clone(r.Setup), SetupCache: r.SetupCache, SetupImage: r.SetupImage,
		Timeout: r.Timeout, OnTimeout: r.OnTimeout, Deadline: deadline,
		creatorPid: r.CreatorPid,
	}
}

// Record returns sandbox ref's full record as JSON, host PIDs and paths
// included, with its state computed now: for debugging. Its fields are
// the engine's own and may change between versions.
func (e *Engine) Record(ctx context.Context, ref string) (json.RawMessage, error) {
	sb, err := e.get(ctx, ref)
	if err != nil {
		return nil, err
	}
	return json.MarshalIndent(sb, "", "  ")
}

func cloneTemplateStart(t *TemplateStart) *TemplateStart {
	if t == nil {
		return nil
	}
	c := *t
	return &c
}
