package engine

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/engine/workspace"
	"hutch.dev/hutch/overlay"
	"hutch.dev/hutch/policy"
	"hutch.dev/hutch/runsc"
)

// PersistState is the part of a sandbox record that pause/resume, fork,
// the setup cache and the lifetime (--timeout) keep.
type PersistState struct {
	// Paused: the sandbox's state is in Checkpoint; it has no processes.
	Paused bool `json:"paused,omitempty"`
	// Checkpoint is the digest of the memory checkpoint of a paused
	// sandbox, in the image store.
	Checkpoint digest.Digest `json:"checkpoint,omitempty"`
	// ForkedFrom is the sandbox this one was forked from.
	ForkedFrom string `json:"forkedFrom,omitempty"`
	// Template says how a sandbox of a template image began: restored
	// from its checkpoint, or cold with its start command, and why.
	Template *TemplateStart `json:"template,omitempty"`
	// Setup are the --setup commands of the create; SetupCache says
	// whether they ran ("ran": their result was cached as SetupImage) or
	// the sandbox started from the cache ("hit").
	Setup      []string `json:"setup,omitempty"`
	SetupCache string   `json:"setupCache,omitempty"`
	SetupImage string   `json:"setupImage,omitempty"`
	// CheckpointHead is the checkpoint of the sandbox's tree it is at:
	// the last one taken or restored, the next one's parent.
	CheckpointHead string `json:"checkpointHead,omitempty"`
	// CheckpointKept: Checkpoint, of a paused sandbox, belongs to its
	// checkpoint tree (a restore recorded it), which keeps it after the
	// resume.
	CheckpointKept bool `json:"checkpointKept,omitempty"`
	// The detached process that checksums and chunks the sandbox's
	// checkpoints (StoreCheckpoints), which a removal ends first.
	StorerPid   int    `json:"storerPid,omitempty"`
	StorerStart uint64 `json:"storerStart,omitempty"`
	// ForkedFromCheckpoint is the checkpoint this fork was made from.
	ForkedFromCheckpoint string `json:"forkedFromCheckpoint,omitempty"`
	// Timeout is the sandbox's lifetime (a Go duration); when Deadline
	// passes, OnTimeout happens ("pause", "stop" or "rm"). Resume starts
	// a new lifetime of the same length.
	Timeout   string     `json:"timeout,omitempty"`
	OnTimeout string     `json:"onTimeout,omitempty"`
	Deadline  *time.Time `json:"deadline,omitempty"`
	// WatchdogPid is the host process that enforces Deadline; its start
	// time tells it from a reused PID.
	WatchdogPid   int    `json:"watchdogPid,omitempty"`
	WatchdogStart uint64 `json:"watchdogStart,omitempty"`
}

// snapshotExclude are the sandbox paths a snapshot never captures: /run
// holds secrets (tmpfs files) and runtime state, /.hutch the agent,
// /etc/machine-id the sandbox's own machine ID (a mount over the image's).
var snapshotExclude = []string{"/run", "/.hutch", "/etc/machine-id"}

// SnapshotRequest names the image a snapshot becomes.
type SnapshotRequest struct {
	// Name tags the image; empty means "snapshot/<short ID>:<UTC time>".
	Name string
}

// Snapshot commits the filesystem changes of running sandbox ref (its
// gVisor upper layer) as one layer on top of its image, tagged req.Name.
// The sandbox keeps running. /run and /.hutch are never captured. An
// interrupted snapshot leaves no image (see overlay's persistence
// contract).
func (e *Engine) Snapshot(ctx context.Context, ref string, req SnapshotRequest) (overlay.Image, error) {
	sb, err := e.get(ctx, ref)
	if err != nil {
		return overlay.Image{}, err
	}
	name := req.Name
	if name == "" {
		name = "snapshot/" + sb.ShortID() + ":" + time.Now().UTC().Format("20060102-150405")
	}
	if name, err = overlay.ParseName(name); err != nil {
		return overlay.Image{}, err
	}
	unlock, err := e.lockSandbox(sb.ID)
	if err != nil {
		return overlay.Image{}, err
	}
	defer unlock()
	if sb, err = e.load(sb.ID); err != nil {
		return overlay.Image{}, err
	}
	if sb.State != StateRunning {
		return overlay.Image{}, fmt.Errorf("sandbox %s is %s, not running: %w", sb.ShortID(), sb.State, errdefs.ErrFailedPrecondition)
	}
	return e.snapshotLocked(ctx, sb, name, "hutch snapshot "+sb.ShortID())
}

// sandboxImage is the image sb was created from, as long as its name
// still points at it.
func (e *Engine) sandboxImage(ctx context.Context, sb *record) (overlay.Image, error) {
	img, err := e.images.Get(ctx, sb.Image)
	if err != nil {
		return overlay.Image{}, fmt.Errorf("image %s of sandbox %s: %w", sb.Image, sb.ShortID(), err)
	}
	if img.Digest != sb.ImageDigest {
		return overlay.Image{}, fmt.Errorf("image %s was replaced since sandbox %s was created from it: %w", sb.Image, sb.ShortID(), errdefs.ErrFailedPrecondition)
	}
	return img, nil
}

func (e *Engine) snapshotLocked(ctx context.Context, sb *record, name, history string) (overlay.Image, error) {
	parent, err := e.sandboxImage(ctx, sb)
	if err != nil {
		return overlay.Image{}, err
	}
	start := time.Now()
	if err := e.checkLargeFiles(ctx, sb); err != nil {
		return overlay.Image{}, err
	}
	start = phase(ctx, "snapshot: looked for files larger than --disk", start)
	opts := overlay.SnapshotOptions{Name: name, Parent: parent, Exclude: snapshotExclude, History: history}
	img, err := e.streamSnapshot(ctx, sb, opts)
	if errors.Is(err, overlay.ErrUnordered) {
		// A runsc without tools/runsc/tarorder.patch: its entries come
		// in map order, and the layer is sorted from a copy.
		log.G(ctx).WithError(err).Debug("snapshot: runsc's export is not in name order; sorting a copy of it")
		img, err = e.sortedSnapshot(ctx, sb, opts)
	}
	if err != nil {
		return overlay.Image{}, fmt.Errorf("snapshot: %w", err)
	}
	phase(ctx, "snapshot: exported and stored the layer", start)
	return img, nil
}

// streamSnapshot stores sb's upper layer as runsc exports it.
func (e *Engine) streamSnapshot(ctx context.Context, sb *record, opts overlay.SnapshotOptions) (overlay.Image, error) {
	x, err := e.startUpperExport(ctx, sb)
	if err != nil {
		return overlay.Image{}, err
	}
	// Read ahead of the store into a spool: the sandbox's file
	// operations wait for the export, not for the store.
	ahead := int64(spoolAhead)
	if sb.Disk > 0 {
		ahead = min(ahead, sb.Disk)
	}
	sp, err := newSpool(e.sandboxDir(sb.ID), x.r, ahead)
	if err != nil {
		x.close() //nolint:errcheck // err says more
		return overlay.Image{}, err
	}
	opts.UpperStream = bufio.NewReaderSize(sp, upperBufSize)
	opts.Check = limitCheck(sb.Disk)
	opts.End = x.wait
	img, err := e.images.Snapshot(ctx, opts)
	sp.Close()
	if failed := x.close(); failed != nil && err != nil {
		return overlay.Image{}, failed
	}
	return img, err
}

// spoolAhead is how far a snapshot's spool reads ahead of the store, at
// most: as far as its --disk, when that is less. A refused export puts no
// more than that on the host's disk.
const spoolAhead = 256 << 20

// sortedSnapshot copies sb's upper layer to a temporary file, then stores
// it sorted.
func (e *Engine) sortedSnapshot(ctx context.Context, sb *record, opts overlay.SnapshotOptions) (overlay.Image, error) {
	tmp, err := os.CreateTemp(e.sandboxDir(sb.ID), ".upper-*.tar")
	if err != nil {
		return overlay.Image{}, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if err := e.exportUpper(ctx, sb, tmp); err != nil {
		return overlay.Image{}, err
	}
	opts.Upper = tmp
	return e.images.Snapshot(ctx, opts)
}

// checkpointable refuses a sandbox whose memory cannot be checkpointed:
// one made for a single command, whose init (the command) holds the
// host's pipes.
func checkpointable(sb *record) error {
	if sb.OneShot {
		return fmt.Errorf("sandbox %s runs one command (run --rm) and cannot be paused or forked: %w", sb.ShortID(), errdefs.ErrFailedPrecondition)
	}
	if sb.Docker {
		return fmt.Errorf("sandbox %s is a Docker sandbox and cannot be paused, forked or checkpointed: %s: %w", sb.ShortID(), dockerNoCheckpointWhy, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// lockRunning resolves ref, takes its lock and checks that it runs.
func (e *Engine) lockRunning(ctx context.Context, ref string) (*record, func(), error) {
	sb, err := e.get(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	unlock, err := e.lockSandbox(sb.ID)
	if err != nil {
		return nil, nil, err
	}
	if sb, err = e.load(sb.ID); err != nil {
		unlock()
		return nil, nil, err
	}
	if sb.State != StateRunning {
		unlock()
		return nil, nil, fmt.Errorf("sandbox %s is %s, not running: %w", sb.ShortID(), sb.State, errdefs.ErrFailedPrecondition)
	}
	return sb, unlock, nil
}

// checkpoint stores a checkpoint of running sandbox sb, leaving it
// running. Its files are not yet checksummed (overlay's CommitUnsealed):
// a pause has that done after it returns, a fork never needs it.
func (e *Engine) checkpoint(ctx context.Context, sb *record) (overlay.Checkpoint, error) {
	ci, err := e.images.NewCheckpoint(ctx)
	if err != nil {
		return overlay.Checkpoint{}, err
	}
	defer ci.Abort()
	start := time.Now()
	if err := e.runscFor(sb).Checkpoint(ctx, sb.ID, ci.Dir(), runsc.CheckpointOpts{LeaveRunning: true}); err != nil {
		return overlay.Checkpoint{}, fmt.Errorf("checkpoint sandbox %s: %w", sb.ShortID(), err)
	}
	start = phase(ctx, "runsc checkpoint", start)
	ck, err := ci.CommitUnsealed(ctx, map[string]string{"sandbox": sb.ID})
	phase(ctx, "checkpoint: stored", start)
	return ck, err
}

// Resume restores paused sandbox ref from its checkpoint, after verifying
// every file of it. Every process continues where it was. A corrupt
// checkpoint is refused (the sandbox stays paused); so is a failed restore.
func (e *Engine) Resume(ctx context.Context, ref string) (*Sandbox, error) {
	sb, err := e.get(ctx, ref)
	if err != nil {
		return nil, err
	}
	// The checkpoint is verified before the sandbox's lock is taken, as a
	// stored checkpoint never changes: meanwhile the detached end of the
	// pause may still hold the lock (FinishPause). Under the lock, the
	// record must still name it; if it does not, the one it names is
	// verified there.
	start := time.Now()
	var ck overlay.Checkpoint
	if sb.State == StatePaused {
		if ck, err = e.images.OpenCheckpoint(ctx, sb.Checkpoint); err != nil {
			ck = overlay.Checkpoint{}
		}
	}
	unlock, err := e.lockSandbox(sb.ID)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if sb, err = e.load(sb.ID); err != nil {
		return nil, err
	}
	if sb.State != StatePaused {
		return nil, fmt.Errorf("sandbox %s is %s, not paused: %w", sb.ShortID(), sb.State, errdefs.ErrFailedPrecondition)
	}
	if err := e.checkVolumesPresent(sb.ID); err != nil {
		return nil, fmt.Errorf("resume %s: %w", sb.ShortID(), err)
	}
	if ck.Digest != sb.Checkpoint {
		if ck, err = e.images.OpenCheckpoint(ctx, sb.Checkpoint); err != nil {
			return nil, fmt.Errorf("resume %s: %w", sb.ShortID(), err)
		}
	}
	phase(ctx, "resume: verified the checkpoint", start)
	if err := e.resumeLocked(ctx, sb, ck); err != nil {
		return nil, fmt.Errorf("resume %s: %w", sb.ShortID(), err)
	}
	return sb.view(), nil
}

// resumeLocked restores paused sandbox sb from ck, its checkpoint,
// verified, and records it running. The checkpoint is removed afterwards
// unless a checkpoint tree holds it (CheckpointKept). The caller holds
// sb's lock. On error sb stays paused.
func (e *Engine) resumeLocked(ctx context.Context, sb *record, ck overlay.Checkpoint) error {
	start := time.Now()
	// Whatever a pause interrupted after recording its checkpoint.
	if err := e.destroyRuntime(ctx, sb); err != nil {
		return err
	}
	// Its published ports, bound again on the host ports they had before
	// the restore: one taken meanwhile leaves the sandbox paused. The
	// forwarder ended with the sandbox process at the pause.
	listeners, err := ListenPorts(sb.Ports)
	if err != nil {
		return err
	}
	defer func() {
		for _, l := range listeners {
			l.Listener.Close() // the forwarder has its own copies
		}
	}()
	sb.Forwarder = nil
	var undo assembly.Undo
	defer undo.Run()
	if err := e.resumeNetwork(ctx, sb, &undo); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	start = phase(ctx, "resume: old runtime cleared, network set up", start)
	if err := e.restore(ctx, sb, ck); err != nil {
		return err
	}
	start = phase(ctx, "resume: restored", start)
	undo.Release()
	old, kept := sb.Checkpoint, sb.CheckpointKept
	sb.Paused, sb.Checkpoint, sb.Teardown, sb.CheckpointKept = false, "", false, false
	if err := e.startWatchdog(sb); err != nil {
		log.G(ctx).WithError(err).Warn("lifetime watchdog")
	}
	if err := e.save(sb); err != nil {
		return err
	}
	if !kept {
		if err := e.removeCheckpointLater(ctx, old); err != nil {
			log.G(ctx).WithError(err).Warn("remove used checkpoint")
		}
	}
	sb.State = StateRunning
	if len(listeners) > 0 {
		// After the record says running, which the forwarder checks.
		if err := e.startForwarder(sb, listeners); err != nil {
			return fmt.Errorf("sandbox %s is resumed, but its published ports are not: %w", sb.ShortID(), err)
		}
		if err := e.save(sb); err != nil {
			return err
		}
	}
	phase(ctx, "resume: recorded, checkpoint removed", start)
	return nil
}

// restore starts sb from checkpoint ck with its own bundle, log, overlay
// directory and cgroup, and records the new sandbox process in sb (not
// saved). The cgroup is hutch's, made with the record's current limits before
// runsc runs, as at create: runsc joins it and never deletes it, so an OOM
// after the restore is counted as after a create (docs/decisions/0004). On
// error nothing of the runtime is left.
func (e *Engine) restore(ctx context.Context, sb *record, ck overlay.Checkpoint) error {
	logf, err := os.OpenFile(filepath.Join(e.sandboxDir(sb.ID), "init.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	var undo assembly.Undo
	defer undo.Run()
	res := policy.HostResources(policy.Request{CPUs: sb.CPUs, Memory: sb.Memory, Pids: sb.Pids})
	if err := e.createCgroup(ctx, sb, res, &undo); err != nil {
		return err
	}
	undo.Add(func() {
		if err := e.destroyRuntime(context.Background(), sb); err != nil {
			log.G(ctx).WithError(err).Warn("clean up a failed restore")
		}
	})
	// The :overlay workspaces' host mounts, which the stop of a pause
	// took down (destroyRuntime, in undo, takes them down again).
	if err := workspace.MountAll(e.sandboxDir(sb.ID)); err != nil {
		return err
	}
	r := e.runscFor(sb)
	pidFile := filepath.Join(e.sandboxDir(sb.ID), "sandbox.pid")
	// The file of the process before the pause must not pass for the
	// restored one's.
	if err := os.Remove(pidFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	defer phase(ctx, "runsc restore", time.Now())
	if err := r.Restore(ctx, sb.ID, filepath.Join(e.sandboxDir(sb.ID), "bundle"), ck.Dir, runsc.RestoreOpts{
		Detach: true, PidFile: pidFile, Stdout: logf, Stderr: logf,
	}); err != nil {
		return err
	}
	if err := e.recordProcess(sb, pidFile); err != nil {
		return err
	}
	undo.Release()
	return nil
}

// recordProcess reads the restored sandbox's host process, which runsc
// wrote to pidFile, into sb. As at create, no `runsc state`: a sandbox
// whose process is already gone fails the liveness check.
func (e *Engine) recordProcess(sb *record, pidFile string) error {
	pid, err := readPidFile(pidFile)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", sb.ShortID(), err)
	}
	sb.Pid = pid
	if sb.PidStart, err = assembly.ProcessStart(pid); err != nil {
		return fmt.Errorf("sandbox %s exited right after restore: %w", sb.ShortID(), err)
	}
	sb.BootID = bootID()
	sb.Stopped = false
	return nil
}

// dropCheckpoint forgets and deletes a paused sandbox's checkpoint (on stop
// and rm).
func (e *Engine) dropCheckpoint(ctx context.Context, sb *record) error {
	sb.Teardown = false // its caller, stop or rm, has removed the runtime
	if sb.Checkpoint == "" || sb.CheckpointKept {
		sb.Paused, sb.Checkpoint, sb.CheckpointKept = false, "", false
		return nil
	}
	if err := e.images.RemoveCheckpoint(ctx, sb.Checkpoint); err != nil {
		return err
	}
	sb.Paused, sb.Checkpoint = false, ""
	return nil
}

// ForkRequest says how many copies Fork makes.
type ForkRequest struct {
	// Count is the number of new sandboxes; 0 means 1.
	Count int
}

// Fork makes req.Count new running sandboxes from one checkpoint of
// running sandbox ref, which keeps running. Each copy has its own ID,
// record, overlay directory, cgroup and (empty) network namespace, the
// parent's memory, processes and filesystem, and its own hostname (its
// short ID). All copies are made or none: on error every copy made so far
// is removed. The checkpoint is deleted afterwards.
func (e *Engine) Fork(ctx context.Context, ref string, req ForkRequest) ([]*Sandbox, error) {
	n := req.Count
	if n == 0 {
		n = 1
	}
	if n < 0 || n > 256 {
		return nil, fmt.Errorf("fork count %d: want 1 to 256: %w", n, errdefs.ErrInvalidArgument)
	}
	parent, unlock, err := e.lockRunning(ctx, ref)
	if err != nil {
		return nil, err
	}
	if err := checkpointable(parent); err != nil {
		unlock()
		return nil, err
	}
	img, err := e.sandboxImage(ctx, parent)
	if err != nil {
		unlock()
		return nil, err
	}
	ck, err := e.checkpoint(ctx, parent)
	unlock()
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := e.removeCheckpointLater(context.Background(), ck.Digest); err != nil {
			log.G(ctx).WithError(err).Warn("remove fork checkpoint")
		}
	}()
	// No second verification: the checkpoint's checksums were computed
	// from these very files a moment ago, and nothing else writes them.
	return e.forkCopies(ctx, parent, img, ck, n, "")
}

// forkCopies restores n new sandboxes from checkpoint ck of parent, whose
// image is img; fromCk names the tree checkpoint ck is, if any.
func (e *Engine) forkCopies(ctx context.Context, parent *record, img overlay.Image, ck overlay.Checkpoint, n int, fromCk string) ([]*Sandbox, error) {
	// The copies are independent: restore several at once. A restore
	// waits on process starts and page loads as much as it computes.
	children := make([]*record, n)
	errs := make([]error, n)
	slots := make(chan struct{}, min(n, max(4, 2*runtime.NumCPU())))
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			children[i], errs[i] = e.forkOne(ctx, parent, img, ck, fromCk)
		})
	}
	wg.Wait()
	var ferr error
	for _, err := range errs {
		if err != nil {
			ferr = err // the first; the others are alike
			break
		}
	}
	if ferr != nil {
		for _, c := range children {
			if c == nil {
				continue
			}
			if rerr := e.Remove(context.Background(), c.ID, true); rerr != nil {
				log.G(ctx).WithError(rerr).Warn("remove fork after a failed fork")
			}
		}
		return nil, fmt.Errorf("fork %s: %w", parent.ShortID(), ferr)
	}
	out := make([]*Sandbox, n)
	for i, c := range children {
		out[i] = c.view()
	}
	return out, nil
}

// forkOne restores checkpoint ck of parent as a new sandbox.
func (e *Engine) forkOne(ctx context.Context, parent *record, img overlay.Image, ck overlay.Checkpoint, fromCk string) (*record, error) {
	id, err := newID()
	if err != nil {
		return nil, err
	}
	sb := &record{
		ID: id, Image: parent.Image, ImageDigest: parent.ImageDigest, Created: time.Now().UTC(),
		CPUs: parent.CPUs, Memory: parent.Memory, Pids: parent.Pids, Disk: parent.Disk,
		// A fork gets an empty network namespace, whatever its parent had.
		Network: policy.NetNone, Env: parent.Env, Workdir: parent.Workdir,
		Labels: parent.Labels, Rootless: parent.Rootless, CreatorPid: os.Getpid(),
		ImageEnv: parent.ImageEnv, ImageWorkdir: parent.ImageWorkdir, ImageUser: parent.ImageUser,
		// The secrets are in the checkpointed memory, /run/secrets too.
		Secrets: parent.Secrets, CACerts: parent.CACerts, Mounts: parent.Mounts,
	}
	sb.ForkedFrom, sb.ForkedFromCheckpoint = parent.ID, fromCk
	sb.Timeout, sb.OnTimeout = parent.Timeout, parent.OnTimeout
	var undo assembly.Undo
	defer undo.Run()
	if err := e.reserve(sb, &undo); err != nil {
		return nil, err
	}
	rootfs, err := e.images.Rootfs(ctx, img, id)
	undo.Add(func() { e.images.Release(context.Background(), id) }) //nolint:errcheck // best effort
	if err != nil {
		return nil, err
	}
	sb.Rootfs = rootfs
	spec, err := readSpec(filepath.Join(e.sandboxDir(parent.ID), "bundle"))
	if err != nil {
		return nil, err
	}
	if err := e.adoptMounts(spec, parent.ID, id); err != nil {
		return nil, err
	}
	// Its own machine ID, over the parent's that adoptMounts copied.
	if _, err := e.machineIDMount(id); err != nil {
		return nil, err
	}
	if err := workspace.Fork(ctx, spec, e.sandboxDir(parent.ID), e.sandboxDir(id)); err != nil {
		return nil, err
	}
	spec.Hostname = sb.ShortID()
	spec.Root.Path = rootfs
	e.setRootlessLimits(sb)
	if err := e.forkNetwork(ctx, parent, sb, spec, &undo); err != nil {
		return nil, err
	}
	spec.Linux.CgroupsPath = e.sandboxCgroup(sb)
	spec.Annotations["dev.hutch.sandbox.id"] = id
	for i, kv := range spec.Process.Env {
		if len(kv) > 9 && kv[:9] == "HOSTNAME=" {
			spec.Process.Env[i] = "HOSTNAME=" + sb.ShortID()
		}
	}
	if err := runsc.WriteBundle(filepath.Join(e.sandboxDir(id), "bundle"), spec); err != nil {
		return nil, err
	}
	undo.Add(func() { e.destroyRuntime(context.Background(), sb) }) //nolint:errcheck // best effort
	if err := e.restore(ctx, sb, ck); err != nil {
		return nil, err
	}
	sb.CreatorPid = 0
	if err := e.startWatchdog(sb); err != nil {
		return nil, err
	}
	if err := e.save(sb); err != nil {
		return nil, err
	}
	undo.Release()
	sb.State = StateRunning
	return sb, nil
}

// phase logs, at debug level, how long a step that began at start took,
// and returns the time the next step begins.
func phase(ctx context.Context, step string, start time.Time) time.Time {
	now := time.Now()
	log.G(ctx).WithField("ms", now.Sub(start).Milliseconds()).Debug(step)
	return now
}

// readSpec reads a sandbox's bundle spec, which hutch wrote: it must have
// what resume and fork rebuild from.
func readSpec(bundle string) (*specs.Spec, error) {
	s, err := runsc.ReadBundle(bundle)
	if err != nil {
		return nil, err
	}
	if s.Root == nil || s.Linux == nil || s.Process == nil {
		return nil, errors.New("bundle spec lacks root, linux or process")
	}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	return s, nil
}
