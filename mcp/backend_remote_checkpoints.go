package mcp

import (
	"context"

	"hutch.dev/hutch/client"
)

// The checkpoint tools on a remote server: hutch's checkpoint calls.

func remoteCheckpoint(c client.Checkpoint) checkpointInfo {
	return checkpointInfo{CheckpointID: c.CheckpointID, Parent: c.ParentID, Message: c.Message, Created: c.CreatedAt, SizeBytes: c.SizeBytes, Current: c.Current}
}

func (b *remoteBackend) checkpoint(ctx context.Context, ref, message string, keep int) (checkpointInfo, error) {
	in, err := b.sandbox(ctx, ref)
	if err != nil {
		return checkpointInfo{}, err
	}
	c, err := b.c.Checkpoint(ctx, in.SandboxID, message, keep)
	if err != nil {
		return checkpointInfo{}, b.err(err)
	}
	return remoteCheckpoint(*c), nil
}

func (b *remoteBackend) checkpoints(ctx context.Context, ref string) ([]checkpointInfo, error) {
	in, err := b.sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	cks, err := b.c.Checkpoints(ctx, in.SandboxID)
	if err != nil {
		return nil, b.err(err)
	}
	out := make([]checkpointInfo, 0, len(cks))
	for _, c := range cks {
		out = append(out, remoteCheckpoint(c))
	}
	return out, nil
}

func (b *remoteBackend) restore(ctx context.Context, ref, ck string) (sandboxInfo, error) {
	in, err := b.sandbox(ctx, ref)
	if err != nil {
		return sandboxInfo{}, err
	}
	if _, err := b.c.Restore(ctx, in.SandboxID, ck); err != nil {
		return sandboxInfo{}, b.err(err)
	}
	if in, err = b.c.Get(ctx, in.SandboxID); err != nil {
		return sandboxInfo{}, b.err(err)
	}
	return b.info(in), nil
}

func (b *remoteBackend) diffCheckpoints(ctx context.Context, ref, from, to string) ([]changeInfo, error) {
	in, err := b.sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	if to == "" {
		to = client.CheckpointLive
	}
	chs, err := b.c.DiffCheckpoints(ctx, in.SandboxID, from, to)
	if err != nil {
		return nil, b.err(err)
	}
	out := make([]changeInfo, 0, len(chs))
	for _, c := range chs {
		out = append(out, changeInfo{Kind: c.Kind, Path: c.Path, From: c.From, Type: c.Type})
	}
	return out, nil
}
