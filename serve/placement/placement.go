// Package placement is what `hutch serve`'s handlers need of the backend
// that places its sandboxes: the Placement interface, the requests and
// records it takes and gives, and what its implementations share (the
// labels of a sandbox's record, the per-sandbox lock). Package serve
// implements it over hutch's engine on this host; package serve/kubeplace
// on a Kubernetes cluster. serve.New picks one from its Config; nothing
// else in serve asks which.
//
// A sandbox is an *engine.Sandbox for every backend: its Labels hold what
// the server keeps of it (LabelTenant, LabelTemplate, ...), however the
// backend stores them.
package placement

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/policy"
	"hutch.dev/hutch/serve/envdpb/filesystempb/filesystempbconnect"
	"hutch.dev/hutch/serve/tenant"
)

// ErrNotImplemented is what a backend's error wraps for a call, or a part
// of one, that it cannot do: serve answers it with 501 Not Implemented,
// in E2B's error shape, wherever it comes from.
var ErrNotImplemented = errdefs.ErrNotImplemented

// Labels the server keeps on the sandboxes it creates: a restarted server
// reads everything back from them.
const (
	LabelPrefix   = "hutch.serve/"
	LabelTenant   = LabelPrefix + "tenant"
	LabelTemplate = LabelPrefix + "template"
	// LabelPrivate: port previews need the sandbox's traffic token
	// (public traffic is off).
	LabelPrivate   = LabelPrefix + "private-traffic"
	LabelAutoPause = LabelPrefix + "auto-pause"
	// LabelAutoResume: a request with no key (a port preview of a
	// public sandbox) may resume the sandbox when it is paused (E2B's
	// autoResume).
	LabelAutoResume = LabelPrefix + "auto-resume"
	// LabelVolumes records a sandbox's E2B volumeMounts (JSON), for
	// GET /sandboxes/{id}.
	LabelVolumes = LabelPrefix + "volumes"
	// LabelTokenGeneration is the generation of the sandbox's tokens
	// (credential.Key.Token), in decimal; none is generation 0. Raising
	// it revokes the tokens the sandbox had.
	LabelTokenGeneration = LabelPrefix + "token-generation"
	// MetaPrefix prefixes the E2B metadata keys of a sandbox.
	MetaPrefix = "meta."
)

// DefaultUser is the user E2B's data plane runs as when a request names
// none: the default image's unprivileged user.
const DefaultUser = "user"

// Placement is a backend that places and runs the server's sandboxes.
// The handlers check a call's arguments before they call it (ValidID,
// the tenant owns the sandbox, the E2B fields' limits); a backend checks
// what is its own (its templates, what it can do). A call a backend
// cannot do returns an error wrapping ErrNotImplemented.
type Placement interface {
	// Unsupported is why the backend cannot do f, wrapping
	// ErrNotImplemented; nil if it can. what names f in the message, as
	// the client knows it (a call, a field of a request).
	Unsupported(f Feature, what string) error

	// Get is sandbox id, ErrNotFound if the backend has none.
	Get(ctx context.Context, id string) (*engine.Sandbox, error)
	// List is tenant's sandboxes, oldest first; with tenant "" every
	// sandbox of the backend (which may include some without
	// LabelTenant: not the server's).
	List(ctx context.Context, tenantName string) ([]*engine.Sandbox, error)
	// Prepare checks and resolves a create (its template, what it
	// mounts), making nothing: Create makes what it returns.
	Prepare(ctx context.Context, req CreateRequest) (Prepared, error)
	Create(ctx context.Context, p Prepared) (*engine.Sandbox, error)
	// Remove removes sandbox id, running or paused, and what it holds.
	Remove(ctx context.Context, id string) error
	// Pause pauses running sandbox sb: its memory and files are kept.
	Pause(ctx context.Context, sb *engine.Sandbox) error
	// Resume resumes paused sandbox id; the server makes sure that it
	// runs once at a time.
	Resume(ctx context.Context, id string) (*engine.Sandbox, error)
	// SetTimeout sets sandbox id's life to d from now (0: no deadline),
	// keeping what happens at its end.
	SetTimeout(ctx context.Context, id string, d time.Duration) (*engine.Sandbox, error)
	// SetTokenGeneration records gen as sandbox id's token generation
	// (LabelTokenGeneration), running or paused: it holds through pause,
	// resume and the server's restart. The server holds the sandbox's
	// lock (Locks) around it.
	SetTokenGeneration(ctx context.Context, id string, gen uint64) (*engine.Sandbox, error)
	// Fork makes count copies of running sandbox parent, each with
	// timeout to live. An error is the fork's as a whole; each copy's
	// own is in its result.
	Fork(ctx context.Context, parent *engine.Sandbox, count int, timeout time.Duration) ([]Forked, error)
	// UpdateNetwork sets sandbox id's network mode and allowed
	// destinations (engine.UpdateRequest's).
	UpdateNetwork(ctx context.Context, id, mode string, allow []string) error
	// Stats is running sandbox id's use of its resources.
	Stats(ctx context.Context, id string) (*engine.Stats, error)
	// Logs writes sandbox id's log to w: lines "TIMESTAMP TEXT".
	Logs(ctx context.Context, id string, w io.Writer) error

	// CheckSnapshotName refuses a name a new snapshot of tenant may not
	// take (one the backend reserves).
	CheckSnapshotName(tenantName, name string) error
	// HasSnapshot tells whether tenant has a snapshot (a template of its
	// own) of that name.
	HasSnapshot(ctx context.Context, tenantName, name string) (bool, error)
	// Snapshot makes running sandbox id's memory and files tenant's
	// template name; the sandbox runs on.
	Snapshot(ctx context.Context, id, tenantName, name string) error
	// ListSnapshots are the names of tenant's snapshots, of sandbox
	// sandboxID only unless "", of that name only unless "".
	ListSnapshots(ctx context.Context, tenantName, sandboxID, name string) ([]string, error)
	// ListTemplates are the templates tenant may create from.
	ListTemplates(ctx context.Context, tenantName string) ([]Template, error)
	// DeleteTemplate removes tenant's own template (snapshot) id.
	DeleteTemplate(ctx context.Context, tenantName, id string) error
	// SnapshotsUsage is what tenant's snapshots hold of its quota: their
	// number (Snapshots) and the disk they take (Disk), nothing else.
	SnapshotsUsage(ctx context.Context, tenantName string) (tenant.Usage, error)

	// Checkpoint takes a checkpoint of running sandbox id (memory,
	// processes, files); Checkpoints lists its tree; RemoveCheckpoint,
	// Restore and DiffCheckpoints act on one of it (engine's
	// Checkpoint, Checkpoints, RemoveCheckpoint, Restore and
	// DiffCheckpoints). Restore keeps the sandbox's ID, address,
	// tokens and labels. ForkFrom makes count running sandboxes from
	// checkpoint ck of sandbox parent, each with timeout to live.
	// CheckpointsUsage is what tenant's checkpoints hold of its quota.
	Checkpoint(ctx context.Context, id string, req engine.CheckpointRequest) (engine.CheckpointInfo, error)
	Checkpoints(ctx context.Context, id string) ([]engine.CheckpointInfo, error)
	RemoveCheckpoint(ctx context.Context, id, ck string) error
	Restore(ctx context.Context, id, ck string) (*engine.Sandbox, error)
	DiffCheckpoints(ctx context.Context, id, a, b string) ([]engine.CheckpointChange, error)
	ForkFrom(ctx context.Context, parent *engine.Sandbox, ck string, count int, timeout time.Duration) ([]Forked, error)
	CheckpointsUsage(ctx context.Context, tenantName string) (tenant.Usage, error)

	// CreateVolume, GetVolume and DeleteVolume make, find and remove
	// tenant's volume name; ListVolumes lists tenant's volumes' names.
	CreateVolume(ctx context.Context, tenantName, name string) error
	GetVolume(ctx context.Context, tenantName, name string) error
	ListVolumes(ctx context.Context, tenantName string) ([]string, error)
	DeleteVolume(ctx context.Context, tenantName, name string) error
	// VolumesDisk is the disk tenant's volumes take, which counts toward
	// its disk quota.
	VolumesDisk(ctx context.Context, tenantName string) (int64, error)

	// DialPort connects to port inside running sandbox id; ctx bounds
	// what the connection needs beyond it (an agent session).
	DialPort(ctx context.Context, id string, port uint16) (net.Conn, error)
	// Processes is how envd's process service runs commands.
	Processes() Processes
	// Filesystem is envd's filesystem service; nil if the backend has
	// none (Unsupported(FeatureFilesystem, ...) says why).
	Filesystem() filesystempbconnect.FilesystemHandler
	// Files opens sandbox id's files for envd's /files, as user u.
	Files(ctx context.Context, id string, u FileUser) (Files, error)

	// Forget drops what the backend holds of sandbox id's current run
	// (a port dialer): the server removes or pauses it.
	Forget(id string)
	// Recover removes the backend's sandboxes that are of no more use
	// (stopped, left half-made, past their deadline), calling forget
	// for each first; a sandbox that looks dead may be looked at again
	// recheck later before it goes. It returns how many it removed.
	Recover(ctx context.Context, recheck time.Duration, forget func(id string)) (int, error)
	// SweepInterval is how often the server runs Recover.
	SweepInterval() time.Duration
	// Close releases what the backend holds for the server; sandboxes
	// go on.
	Close() error
}

// Feature is something a backend may be unable to do: a whole call of
// the API, or a field of a create.
type Feature int

// Features a backend may not have.
const (
	// Calls of the API.
	FeatureNetworkUpdate Feature = iota
	FeatureMetrics
	FeatureLogs
	FeatureTemplates
	FeatureVolumes
	// FeatureSnapshots is taking snapshots of sandboxes.
	FeatureSnapshots
	// FeatureFilesystem is envd's filesystem service (beside /files).
	FeatureFilesystem

	// Fields of a create.
	FeatureMCP
	FeatureIAM
	FeatureVolumeMounts
	// FeatureAutoPause is pausing at the timeout (autoPause).
	FeatureAutoPause
	// FeatureMemorylessPause is a pause that keeps files only
	// (autoPauseMemory false).
	FeatureMemorylessPause
	// FeatureAllowOut is a network open to listed destinations only.
	FeatureAllowOut
	// FeatureCheckpoints is a sandbox's tree of checkpoints, restored in
	// place (an extension of hutch's: E2B has no such call).
	FeatureCheckpoints
)

// CreateRequest is a create as the handlers checked it.
type CreateRequest struct {
	Tenant string
	// TemplateID is E2B's templateID, checked by serve's rules.
	TemplateID string
	// Timeout is the sandbox's life from its create; zero: no deadline.
	Timeout time.Duration
	// AutoPause pauses the sandbox at its timeout rather than remove it.
	AutoPause bool
	// AutoResume lets a request with no key resume the sandbox when it
	// is paused (LabelAutoResume).
	AutoResume bool
	// Network is none, allow (with Allow) or open.
	Network string
	Allow   []string
	// NetworkGiven: the request named a network (allow_internet_access or
	// network), rather than take the server's default.
	NetworkGiven bool
	// Private: port previews need the sandbox's traffic token.
	Private      bool
	Metadata     map[string]string
	Env          map[string]string
	VolumeMounts json.RawMessage
}

// Prepared is a create a backend checked and resolved, for its Create.
type Prepared interface {
	// Usage is what the create takes from its tenant's quota.
	Usage() tenant.Usage
}

// Forked is one copy of a fork: its sandbox, or why it was not made.
type Forked struct {
	Sandbox *engine.Sandbox
	Err     error
}

// Template is an image a tenant may create sandboxes from.
type Template struct {
	ID, BuildID string
	// Public: shared by every tenant, not the tenant's own.
	Public  bool
	Created time.Time
}

// Processes is what envd's process service needs of a backend.
type Processes struct {
	// Start starts a command in sandbox sandboxID.
	Start func(ctx context.Context, sandboxID string, req engine.ExecRequest) (Command, error)
	// Supervise returns the supervisor of a sandbox, bound to ctx; nil:
	// every command goes through Start.
	Supervise func(ctx context.Context, sandboxID string) (Supervisor, error)
	// Stat fails with ErrNotFound for a path that does not exist there.
	Stat func(ctx context.Context, sandboxID, path string) error
	// Home is a user's home directory.
	Home func(ctx context.Context, sandboxID, user string) (string, error)
}

// Command is a started command: an *engine.Command, a pod's, or a fake
// in tests.
type Command interface {
	Pid() int
	Signal(os.Signal) error
	Resize(engine.WinSize) error
	Wait() (int, error)
}

// Supervisor is an engine.Supervisor as the process service needs it, or
// a fake in tests.
type Supervisor interface {
	Start(ctx context.Context, req engine.ExecRequest, meta []byte) (Command, error)
	Attach(ctx context.Context, pid int, req engine.AttachRequest) (Command, error)
	List(ctx context.Context) ([]engine.SupervisedProcess, error)
	Close()
}

// FileUser is the user a /files request acts as.
type FileUser struct {
	// Named is the user the request names (?username=), "" if none.
	Named string
	// Default is the request's user otherwise: its HTTP Basic
	// authentication's, else DefaultUser.
	Default string
}

// Files is a sandbox's files as one user reaches them through /files.
type Files interface {
	// Home is the user's home directory, which relative paths are
	// resolved against.
	Home(ctx context.Context) (string, error)
	// Read writes the file at path to w.
	Read(ctx context.Context, path string, w io.Writer) error
	// Write creates or replaces the file at path with data, making its
	// missing parents, and makes meta its user metadata (E2B's file
	// metadata: a new upload replaces the set, keys not in meta are
	// removed). It returns the metadata the file has then.
	Write(ctx context.Context, path string, data io.Reader, meta map[string]string) (map[string]string, error)
	// NamesDownloads tells whether a download names its file to the
	// client (Content-Disposition).
	NamesDownloads() bool
}

// ValidID tells whether id is a sandbox ID as the server makes them: 32
// hex digits.
func ValidID(id string) bool {
	if len(id) != 32 {
		return false
	}
	for _, c := range id {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}

// UsageOf is what a sandbox of cpus, memory and disk takes from its
// tenant's quota, with hutch's defaults for what is zero.
func UsageOf(cpus float64, memory, disk int64) tenant.Usage {
	u := tenant.Usage{Sandboxes: 1, CPUs: cpus, Memory: memory, Disk: disk}
	if u.CPUs == 0 {
		u.CPUs = policy.DefaultCPUs
	}
	if u.Memory == 0 {
		u.Memory = policy.DefaultMemory
	}
	if u.Disk == 0 {
		u.Disk = policy.DefaultDisk
	}
	return u
}
