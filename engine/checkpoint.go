package engine

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"

	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/overlay"
	"hutch.dev/hutch/runsc"
)

// A sandbox's checkpoints form a tree: each one holds the sandbox's
// memory, processes and files at one moment, and knows its parent, the
// checkpoint the sandbox was at when it was taken (the last one taken or
// restored). Restore puts the sandbox back at one of them in place: same
// ID, name, address, ports, network policy, volumes and tokens.
//
// On disk: R/sandboxes/<id>/checkpoints/<checkpoint ID>.json, one record
// each; the memory in the image store's checkpoint store, with the files
// (the sandbox's changes to its image, as a layer tar) beside it, both in
// the store's content-defined chunks (overlay/chunks.go). Removing the
// sandbox removes them all.

// CheckpointInfo is one checkpoint of a sandbox's tree.
type CheckpointInfo struct {
	// ID is "ck-" and 12 hexadecimal digits, unique on the host.
	ID string `json:"id"`
	// Sandbox is the sandbox it was taken of.
	Sandbox string `json:"sandbox"`
	// Parent is the checkpoint the sandbox was at when this one was
	// taken: the last one taken or restored; empty for a root.
	Parent  string    `json:"parent,omitempty"`
	Message string    `json:"message,omitempty"`
	Created time.Time `json:"created"`
	// Memory is the memory checkpoint in the image store.
	Memory digest.Digest `json:"memory"`
	// MemorySize is its size on disk.
	MemorySize int64 `json:"memorySize"`
	// FilesSize is the size of the layer of the sandbox's changes to
	// its image at the checkpoint, which is kept in the store's chunks
	// as the memory is: FilesStored is what it added to them.
	FilesSize   int64 `json:"filesSize"`
	FilesStored int64 `json:"filesStored"`
	// Current: the sandbox is at this checkpoint (it was the last one
	// taken or restored). Computed when listed.
	Current bool `json:"current,omitempty"`
	// Chunked: the memory is in the store's content-defined chunks,
	// shared with every checkpoint that holds the same bytes;
	// MemoryStored is what its chunks added to the store (the rest was
	// there already). Whole: the memory is also on disk whole, as the
	// checkpoint the sandbox is at keeps it for a fast restore; the
	// others are made whole again from their chunks when restored.
	// Computed when listed.
	Chunked      bool  `json:"chunked,omitempty"`
	MemoryStored int64 `json:"memoryStored,omitempty"`
	Whole        bool  `json:"whole,omitempty"`
	// Disk is what the checkpoint takes on disk of its own: the chunks
	// it added, and its memory whole while it is kept so. Computed when
	// listed.
	Disk int64 `json:"disk"`
}

// Size is the checkpoint's memory and files.
func (c CheckpointInfo) Size() int64 { return c.MemorySize + c.FilesSize }

// CheckpointRequest says what Checkpoint records and keeps.
type CheckpointRequest struct {
	// Message describes the checkpoint (at most 1024 bytes).
	Message string
	// Keep, if above 0, is how many checkpoints of the sandbox to keep:
	// the oldest beyond it are removed once this one is taken.
	Keep int
	// MaxAge, if above 0, removes the checkpoints older than it once
	// this one is taken.
	MaxAge time.Duration
}

// maxCheckpointMessage bounds a checkpoint's message.
const maxCheckpointMessage = 1024

// ValidCheckpointID checks that id is a checkpoint ID ("ck-" and 12
// lowercase hexadecimal digits): a name that is a path, or anything else,
// wraps errdefs.ErrInvalidArgument.
func ValidCheckpointID(id string) error {
	ok := len(id) == 15 && strings.HasPrefix(id, "ck-")
	for _, c := range id[min(len(id), 3):] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("checkpoint %q: not a checkpoint ID (ck- and 12 hexadecimal digits): %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

func newCheckpointID() (string, error) {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return "ck-" + hex.EncodeToString(b), nil
}

func (e *Engine) checkpointsDir(id string) string {
	return filepath.Join(e.sandboxDir(id), "checkpoints")
}

func (e *Engine) checkpointRecordPath(sandbox, ck string) string {
	return filepath.Join(e.checkpointsDir(sandbox), ck+".json")
}

// readCheckpointInfo reads checkpoint ck of sandbox sb; one the sandbox
// does not have (another's, or none) wraps errdefs.ErrNotFound.
func (e *Engine) readCheckpointInfo(sb *record, ck string) (CheckpointInfo, error) {
	if err := ValidCheckpointID(ck); err != nil {
		return CheckpointInfo{}, err
	}
	var info CheckpointInfo
	err := readJSON(e.checkpointRecordPath(sb.ID, ck), &info,
		"sandbox "+sb.ShortID()+" has no checkpoint "+ck, "checkpoint "+ck+": corrupt record")
	if err != nil {
		return CheckpointInfo{}, err
	}
	if info.ID != ck || info.Sandbox != sb.ID {
		return CheckpointInfo{}, fmt.Errorf("checkpoint %s: its record names another: %w", ck, overlay.ErrCorrupt)
	}
	return info, nil
}

// listCheckpoints reads sb's checkpoints, oldest first.
func (e *Engine) listCheckpoints(sb *record) ([]CheckpointInfo, error) {
	ents, err := os.ReadDir(e.checkpointsDir(sb.ID))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []CheckpointInfo
	for _, ent := range ents {
		id, ok := strings.CutSuffix(ent.Name(), ".json")
		if !ok || ValidCheckpointID(id) != nil {
			continue
		}
		info, err := e.readCheckpointInfo(sb, id)
		if err != nil {
			return nil, err
		}
		info.Current = id == sb.CheckpointHead
		e.storageOf(&info)
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// Checkpoint takes a checkpoint of running sandbox ref (memory, processes
// and files) and leaves it running. Its parent is the checkpoint the
// sandbox is at. With req.Keep or req.MaxAge, older checkpoints are
// removed afterwards. An interrupted checkpoint leaves nothing.
func (e *Engine) Checkpoint(ctx context.Context, ref string, req CheckpointRequest) (CheckpointInfo, error) {
	if len(req.Message) > maxCheckpointMessage {
		return CheckpointInfo{}, fmt.Errorf("checkpoint message: %d bytes, at most %d: %w", len(req.Message), maxCheckpointMessage, errdefs.ErrInvalidArgument)
	}
	if strings.ContainsRune(req.Message, 0) {
		return CheckpointInfo{}, fmt.Errorf("checkpoint message holds a NUL byte: %w", errdefs.ErrInvalidArgument)
	}
	if req.Keep < 0 || req.MaxAge < 0 {
		return CheckpointInfo{}, fmt.Errorf("checkpoint retention: --keep and the age must not be negative: %w", errdefs.ErrInvalidArgument)
	}
	sb, unlock, err := e.lockRunning(ctx, ref)
	if err != nil {
		return CheckpointInfo{}, err
	}
	defer unlock()
	if err := checkpointable(sb); err != nil {
		return CheckpointInfo{}, err
	}
	id, err := newCheckpointID()
	if err != nil {
		return CheckpointInfo{}, err
	}
	start := time.Now()
	mem, files, err := e.checkpointWithFiles(ctx, sb)
	if err != nil {
		return CheckpointInfo{}, err
	}
	keepMem := false
	defer func() {
		if !keepMem {
			e.images.RemoveCheckpoint(context.Background(), mem.Digest) //nolint:errcheck // best effort
		}
	}()
	start = phase(ctx, "checkpoint: memory and files", start)
	info := CheckpointInfo{
		ID: id, Sandbox: sb.ID, Parent: sb.CheckpointHead, Message: req.Message,
		Created: time.Now().UTC(), Memory: mem.Digest, MemorySize: mem.Size(),
		FilesSize: files.size, FilesStored: files.stored,
	}
	if info.Parent != "" {
		if _, err := e.readCheckpointInfo(sb, info.Parent); err != nil {
			info.Parent = "" // removed meanwhile
		}
	}
	if err := os.MkdirAll(e.checkpointsDir(sb.ID), stateDirMode); err != nil {
		return CheckpointInfo{}, err
	}
	if err := writeJSON(e.checkpointRecordPath(sb.ID, id), info); err != nil {
		return CheckpointInfo{}, err
	}
	sb.CheckpointHead = id
	if err := e.save(sb); err != nil {
		os.Remove(e.checkpointRecordPath(sb.ID, id))
		return CheckpointInfo{}, err
	}
	keepMem = true
	// Checksummed and cut into chunks after this returns, by a detached
	// hutch (StoreCheckpoints); a restore meanwhile checksums it itself.
	e.storeCheckpointsLater(ctx, sb)
	if err := e.save(sb); err != nil {
		return CheckpointInfo{}, err
	}
	phase(ctx, "checkpoint: recorded", start)
	if err := e.retainLocked(ctx, sb, req); err != nil {
		return info, fmt.Errorf("checkpoint %s taken, but removing older ones failed: %w", id, err)
	}
	info.Current = true
	return info, nil
}

// retainLocked removes sb's checkpoints beyond req.Keep and older than
// req.MaxAge; never the one the sandbox is at.
func (e *Engine) retainLocked(ctx context.Context, sb *record, req CheckpointRequest) error {
	if req.Keep <= 0 && req.MaxAge <= 0 {
		return nil
	}
	all, err := e.listCheckpoints(sb)
	if err != nil {
		return err
	}
	var drop []string
	for i, c := range all {
		if c.ID == sb.CheckpointHead {
			continue
		}
		old := req.MaxAge > 0 && time.Since(c.Created) > req.MaxAge
		over := req.Keep > 0 && len(all)-i > req.Keep
		if old || over {
			drop = append(drop, c.ID)
		}
	}
	for _, id := range drop {
		if err := e.removeCheckpointLocked(ctx, sb, id); err != nil {
			return err
		}
	}
	return nil
}

// Checkpoints lists the checkpoints of sandbox ref, oldest first.
func (e *Engine) Checkpoints(ctx context.Context, ref string) ([]CheckpointInfo, error) {
	sb, err := e.get(ctx, ref)
	if err != nil {
		return nil, err
	}
	return e.listCheckpoints(sb)
}

// GetCheckpoint returns checkpoint ck of sandbox ref.
func (e *Engine) GetCheckpoint(ctx context.Context, ref, ck string) (CheckpointInfo, error) {
	if err := ValidCheckpointID(ck); err != nil {
		return CheckpointInfo{}, err
	}
	sb, err := e.get(ctx, ref)
	if err != nil {
		return CheckpointInfo{}, err
	}
	info, err := e.readCheckpointInfo(sb, ck)
	info.Current = err == nil && ck == sb.CheckpointHead
	return info, err
}

// RemoveCheckpoint deletes checkpoint ck of sandbox ref: its children
// take its parent as theirs.
func (e *Engine) RemoveCheckpoint(ctx context.Context, ref, ck string) error {
	if err := ValidCheckpointID(ck); err != nil {
		return err
	}
	sb, unlock, err := e.getLocked(ctx, ref)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := e.readCheckpointInfo(sb, ck); err != nil {
		return err
	}
	return e.removeCheckpointLocked(ctx, sb, ck)
}

func (e *Engine) removeCheckpointLocked(ctx context.Context, sb *record, ck string) error {
	info, err := e.readCheckpointInfo(sb, ck)
	if err != nil {
		return err
	}
	all, err := e.listCheckpoints(sb)
	if err != nil {
		return err
	}
	for _, c := range all {
		if c.Parent == ck {
			c.Parent, c.Current = info.Parent, false
			if err := writeJSON(e.checkpointRecordPath(sb.ID, c.ID), c); err != nil {
				return err
			}
		}
	}
	if sb.CheckpointHead == ck {
		sb.CheckpointHead = info.Parent
		if err := e.save(sb); err != nil {
			return err
		}
	}
	if err := os.Remove(e.checkpointRecordPath(sb.ID, ck)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var errs []error
	// A paused sandbox at this checkpoint resumes from it: its memory
	// stays until then (dropCheckpoint).
	if !(sb.Paused && sb.Checkpoint == info.Memory) {
		errs = append(errs, e.images.RemoveCheckpoint(ctx, info.Memory))
	} else {
		sb.CheckpointKept = false
		errs = append(errs, e.save(sb))
	}
	// The chunks only it held.
	if _, err := e.images.PruneChunks(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// removeAllCheckpointsLocked deletes every checkpoint of sb (on rm).
func (e *Engine) removeAllCheckpointsLocked(ctx context.Context, sb *record) error {
	all, err := e.listCheckpoints(sb)
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range all {
		if !(sb.Paused && sb.Checkpoint == c.Memory) {
			errs = append(errs, e.images.RemoveCheckpoint(ctx, c.Memory))
		}
		errs = append(errs, os.Remove(e.checkpointRecordPath(sb.ID, c.ID)))
	}
	if len(all) > 0 {
		if _, err := e.images.PruneChunks(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Restore puts running or paused sandbox ref back at its checkpoint ck,
// in place: the same ID, name, address, published ports, network policy,
// volumes and tokens; its memory, processes and files as they were at the
// checkpoint. Connections into it end (its processes of the moment are
// gone). The checkpoint is verified first: a corrupt one leaves the
// sandbox as it was. The sandbox is then at ck: the next checkpoint's
// parent.
func (e *Engine) Restore(ctx context.Context, ref, ck string) (*Sandbox, error) {
	if err := ValidCheckpointID(ck); err != nil {
		return nil, err
	}
	sb, unlock, err := e.getLocked(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if sb.State != StateRunning && sb.State != StatePaused {
		return nil, fmt.Errorf("sandbox %s is %s, not running or paused: %w", sb.ShortID(), sb.State, errdefs.ErrFailedPrecondition)
	}
	if err := checkpointable(sb); err != nil {
		return nil, err
	}
	info, err := e.readCheckpointInfo(sb, ck)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	mem, err := e.images.OpenCheckpoint(ctx, info.Memory)
	if err != nil {
		return nil, fmt.Errorf("restore %s to %s: %w", sb.ShortID(), ck, err)
	}
	if err := e.checkVolumesPresent(sb.ID); err != nil {
		return nil, fmt.Errorf("restore %s: %w", sb.ShortID(), err)
	}
	start = phase(ctx, "restore: verified the checkpoint", start)
	// Recorded first as paused at the checkpoint, then the sandbox is
	// killed: if hutch dies from here on, the sandbox is paused and a
	// resume restores the checkpoint. A pause's own checkpoint goes once
	// the restore is done.
	pauseCk, pauseOwned := sb.Checkpoint, sb.Paused && !sb.CheckpointKept
	proc := *sb
	sb.Paused, sb.Checkpoint, sb.CheckpointKept, sb.Teardown = true, info.Memory, true, true
	sb.Pid, sb.PidStart = 0, 0
	sb.CheckpointHead = ck
	if err := e.save(sb); err != nil {
		return nil, err
	}
	if proc.State == StateRunning {
		killSandboxProcess(&proc)
	}
	if err := e.resumeLocked(ctx, sb, mem); err != nil {
		return nil, fmt.Errorf("restore %s to %s (it is paused there; resume retries): %w", sb.ShortID(), ck, err)
	}
	// The checkpoint it was at before keeps only its chunks now.
	e.storeCheckpointsLater(ctx, sb)
	if err := e.save(sb); err != nil {
		return nil, err
	}
	if pauseOwned && pauseCk != "" && pauseCk != info.Memory {
		if err := e.removeCheckpointLater(ctx, pauseCk); err != nil {
			log.G(ctx).WithError(err).Warn("remove the pause's checkpoint")
		}
	}
	phase(ctx, "restore: done", start)
	return sb.view(), nil
}

// CheckpointOwner returns the sandbox that checkpoint ck belongs to.
func (e *Engine) CheckpointOwner(ctx context.Context, ck string) (*Sandbox, error) {
	sb, err := e.checkpointOwner(ck)
	if err != nil {
		return nil, err
	}
	return sb.view(), nil
}

func (e *Engine) checkpointOwner(ck string) (*record, error) {
	if err := ValidCheckpointID(ck); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(e.sandboxesDir())
	if err != nil {
		return nil, err
	}
	for _, ent := range ents {
		if _, err := os.Lstat(e.checkpointRecordPath(ent.Name(), ck)); err == nil {
			return e.load(ent.Name())
		}
	}
	return nil, fmt.Errorf("no sandbox has checkpoint %s: %w", ck, errdefs.ErrNotFound)
}

// ForkFrom makes req.Count new running sandboxes from checkpoint ck of
// sandbox ref (any sandbox's when ref is empty): each has the memory,
// processes and files of that moment, and its own ID, hostname, overlay,
// cgroup and network namespace, as Fork's copies. The sandbox ck belongs
// to must still have its bundle (exist); it may run, be paused or
// stopped, and is not changed.
func (e *Engine) ForkFrom(ctx context.Context, ref, ck string, req ForkRequest) ([]*Sandbox, error) {
	n := req.Count
	if n == 0 {
		n = 1
	}
	if n < 0 || n > 256 {
		return nil, fmt.Errorf("fork count %d: want 1 to 256: %w", n, errdefs.ErrInvalidArgument)
	}
	if err := ValidCheckpointID(ck); err != nil {
		return nil, err
	}
	var sb *record
	var err error
	if ref != "" {
		sb, err = e.get(ctx, ref)
	} else {
		sb, err = e.checkpointOwner(ck)
	}
	if err != nil {
		return nil, err
	}
	// The owner's lock for the whole fork: its checkpoint stays.
	unlock, err := e.lockSandbox(sb.ID)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if sb, err = e.load(sb.ID); err != nil {
		return nil, err
	}
	info, err := e.readCheckpointInfo(sb, ck)
	if err != nil {
		return nil, err
	}
	img, err := e.sandboxImage(ctx, sb)
	if err != nil {
		return nil, err
	}
	mem, err := e.images.OpenCheckpoint(ctx, info.Memory)
	if err != nil {
		return nil, fmt.Errorf("fork from %s: %w", ck, err)
	}
	return e.forkCopies(ctx, sb, img, mem, n, ck)
}

// storageOf fills in how info's memory is stored.
func (e *Engine) storageOf(info *CheckpointInfo) {
	idx, ok, err := e.images.CheckpointChunks(info.Memory)
	info.Chunked = ok && err == nil
	if info.Chunked {
		info.MemoryStored = idx.New
	}
	info.Whole = e.images.CheckpointWhole(info.Memory)
	info.Disk = info.MemoryStored + info.FilesStored
	if info.Whole || !info.Chunked {
		info.Disk += info.MemorySize
	}
}

// checkpointFilesInfo is a checkpoint's files layer: its size and what
// it added to the store's chunks.
type checkpointFilesInfo struct{ size, stored int64 }

// checkpointWithFiles stores a checkpoint of running sandbox sb's memory
// (runsc checkpoint, the sandbox left running) and, right after, its
// files: the changes to its image as a layer, cut into the store's
// chunks with the checkpoint (what diff reads). Neither is synced to disk
// nor checksummed yet (CommitUnsealed; StoreCheckpoints does that).
func (e *Engine) checkpointWithFiles(ctx context.Context, sb *record) (overlay.Checkpoint, checkpointFilesInfo, error) {
	ci, err := e.images.NewCheckpoint(ctx)
	if err != nil {
		return overlay.Checkpoint{}, checkpointFilesInfo{}, err
	}
	defer ci.Abort()
	start := time.Now()
	if err := e.runscFor(sb).Checkpoint(ctx, sb.ID, ci.Dir(), runsc.CheckpointOpts{LeaveRunning: true}); err != nil {
		return overlay.Checkpoint{}, checkpointFilesInfo{}, fmt.Errorf("checkpoint sandbox %s: %w", sb.ShortID(), err)
	}
	start = phase(ctx, "runsc checkpoint", start)
	x, err := e.startUpperExport(ctx, sb)
	if err != nil {
		return overlay.Checkpoint{}, checkpointFilesInfo{}, err
	}
	pr, pw := io.Pipe()
	conv := make(chan error, 1)
	go func() {
		err := overlay.UpperLayer(pw, bufio.NewReaderSize(x.r, upperBufSize), snapshotExclude)
		if err == nil {
			_, err = io.Copy(io.Discard, x.r) // runsc's padding
		}
		pw.CloseWithError(err)
		conv <- err
	}()
	cf, stored, err := ci.AddCheckpointFiles(pr)
	pr.CloseWithError(errors.New("checkpoint: stopped reading"))
	if err != nil {
		x.close() //nolint:errcheck // err says more
		<-conv
		return overlay.Checkpoint{}, checkpointFilesInfo{}, fmt.Errorf("checkpoint sandbox %s: its files: %w", sb.ShortID(), err)
	}
	err = <-conv
	if werr := x.wait(); werr != nil && err == nil {
		err = werr
	}
	if xerr := x.close(); xerr != nil && err == nil {
		err = xerr
	}
	if err != nil {
		return overlay.Checkpoint{}, checkpointFilesInfo{}, fmt.Errorf("checkpoint sandbox %s: its files: %w", sb.ShortID(), err)
	}
	start = phase(ctx, "checkpoint: files into chunks", start)
	ck, err := ci.CommitUnsealed(ctx, map[string]string{"sandbox": sb.ID})
	phase(ctx, "checkpoint: stored", start)
	return ck, checkpointFilesInfo{size: cf.Size, stored: stored}, err
}

// StoreCheckpointsCommand is the hutch subcommand that checksums and
// chunks a sandbox's checkpoints (StoreCheckpoints); its argument is the
// sandbox ID.
const StoreCheckpointsCommand = "__store-checkpoints"

// storeCheckpointsLater has a detached hutch run StoreCheckpoints for
// sb, recorded in sb (saved by the caller, which holds sb's lock) so that
// a removal ends it first (stopStorer); or runs it here if none starts.
func (e *Engine) storeCheckpointsLater(ctx context.Context, sb *record) {
	stopStorer(sb)
	if pid := e.spawnDetached(StoreCheckpointsCommand, sb.ID); pid != 0 {
		sb.StorerPid = pid
		sb.StorerStart, _ = assembly.ProcessStart(pid)
		return
	}
	if err := e.storeCheckpoints(ctx, sb.ID, true); err != nil {
		log.G(ctx).WithError(err).Warn("store checkpoints")
	}
}

// stopStorer ends sb's checkpoint storer (StoreCheckpoints), if it runs
// and is not the calling process, and waits for it.
func stopStorer(sb *record) {
	pid, start := sb.StorerPid, sb.StorerStart
	if pid == 0 || pid == os.Getpid() {
		return
	}
	sb.StorerPid, sb.StorerStart = 0, 0
	if assembly.SameProcess(pid, start) {
		syscall.Kill(pid, syscall.SIGKILL) //nolint:errcheck // may be gone
		for i := 0; i < 200 && processAlive(pid) && !assembly.IsZombie(pid); i++ {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// StoreCheckpoints checksums the checkpoints of sandbox id, cuts their
// memory into the store's chunks, and removes the whole memory of every
// one but the checkpoint the sandbox is at (and a pause's), which stays
// whole for a fast restore. It runs after a checkpoint or a restore
// returns; each step does nothing if done.
func (e *Engine) StoreCheckpoints(ctx context.Context, id string) error {
	return e.storeCheckpoints(ctx, id, false)
}

// storeCheckpoints is StoreCheckpoints; locked says whether the caller
// holds the sandbox's lock.
func (e *Engine) storeCheckpoints(ctx context.Context, id string, locked bool) error {
	sb, err := e.load(id)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	cks, err := e.listCheckpoints(sb)
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range cks {
		if !c.Whole || c.Chunked {
			continue
		}
		err := e.images.SealCheckpoint(ctx, c.Memory)
		if err == nil {
			_, err = e.images.ChunkCheckpoint(ctx, c.Memory)
		}
		if err != nil && !errdefs.IsNotFound(err) && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("checkpoint %s: %w", c.ID, err))
		}
	}
	// Evicting needs the lock: a restore or a fork reads the files.
	if !locked {
		unlock, err := e.lockSandbox(id)
		if errors.Is(err, fs.ErrNotExist) {
			return errors.Join(errs...)
		}
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		defer unlock()
	}
	if sb, err = e.load(id); err != nil {
		if errdefs.IsNotFound(err) {
			err = nil
		}
		return errors.Join(append(errs, err)...)
	}
	if cks, err = e.listCheckpoints(sb); err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, c := range cks {
		if c.Current || !c.Whole || !c.Chunked || (sb.Paused && sb.Checkpoint == c.Memory) {
			continue
		}
		if err := e.images.EvictCheckpoint(ctx, c.Memory); err != nil {
			errs = append(errs, fmt.Errorf("checkpoint %s: %w", c.ID, err))
		}
	}
	return errors.Join(errs...)
}
