package mcp

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// The checkpoint tools: a save point of a whole sandbox (memory,
// processes, files) and undo to it.
const (
	toolCheckpoint      = "checkpoint"
	toolListCheckpoints = "list_checkpoints"
	toolRestore         = "restore_checkpoint"
	toolDiffCheckpoints = "diff_checkpoints"
)

func (s *Server) addCheckpointTools() {
	add(s, &sdk.Tool{Name: toolCheckpoint, Title: "Save point",
		Description: "Take a save point of a running sandbox before something risky (a migration, an upgrade, a refactor, a command you are unsure of): " +
			"its memory, running processes (shells, servers) and files, as they are now. The sandbox keeps running. " +
			"Returns a checkpoint_id; restore_checkpoint with it undoes everything done since, in place. Give a short message saying what state it saves.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &no},
	}, nil, s.checkpoint)
	add(s, &sdk.Tool{Name: toolListCheckpoints, Title: "List save points",
		Description: "List a sandbox's save points (checkpoints), oldest first, with their messages, times, sizes and parent: they form a tree, as a restore then new work branches off. " +
			"current marks the one the sandbox is at.",
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &no},
	}, nil, s.listCheckpoints)
	add(s, &sdk.Tool{Name: toolRestore, Title: "Undo to a save point",
		Description: "Undo: put the sandbox back exactly at a save point (checkpoint), in place: its files, memory and running processes become what they were then; " +
			"everything done since is gone (keep it by taking a checkpoint first). Same sandbox_id, address and ports; programs started since are gone, connections close. " +
			"Can be repeated any number of times, to any checkpoint of the sandbox.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &yes, IdempotentHint: true, OpenWorldHint: &no},
	}, nil, s.restoreCheckpoint)
	add(s, &sdk.Tool{Name: toolDiffCheckpoints, Title: "Compare save points",
		Description: "List the files added (A), changed (M), deleted (D) and renamed (R) between two save points of a sandbox, or between one and the sandbox now (leave to empty): " +
			"what a restore_checkpoint to from would undo.",
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &no},
	}, nil, s.diffCheckpoints)
}

type checkpointArgs struct {
	sandboxArg
	Message string `json:"message,omitempty" jsonschema:"what state this save point holds, e.g. before upgrading django"`
	Keep    int    `json:"keep,omitempty" jsonschema:"keep only this many of the sandbox's newest checkpoints (default: all)"`
}

// checkpointInfo is one checkpoint as the tools give it.
type checkpointInfo struct {
	CheckpointID string    `json:"checkpoint_id" jsonschema:"pass it to restore_checkpoint"`
	Parent       string    `json:"parent,omitempty"`
	Message      string    `json:"message,omitempty"`
	Created      time.Time `json:"created"`
	SizeBytes    int64     `json:"size_bytes"`
	Current      bool      `json:"current,omitempty" jsonschema:"the sandbox is at this checkpoint"`
}

type checkpointList struct {
	Checkpoints []checkpointInfo `json:"checkpoints"`
}

type restoreArgs struct {
	sandboxArg
	CheckpointID string `json:"checkpoint_id" jsonschema:"the checkpoint_id that checkpoint returned"`
}

type diffArgs struct {
	sandboxArg
	From string `json:"from" jsonschema:"a checkpoint_id"`
	To   string `json:"to,omitempty" jsonschema:"another checkpoint_id; empty: the sandbox now"`
}

// changeInfo is one path of a diff.
type changeInfo struct {
	Kind string `json:"kind" jsonschema:"A added, M changed, D deleted, R renamed"`
	Path string `json:"path"`
	From string `json:"from,omitempty" jsonschema:"a renamed file's old path"`
	Type string `json:"type"`
}

type changeList struct {
	Changes []changeInfo `json:"changes"`
}

// checkCheckpointID refuses what is not a checkpoint ID ("ck-" and 12
// hexadecimal digits) before any backend sees it.
func checkCheckpointID(id string) error {
	ok := len(id) == 15 && id[:3] == "ck-"
	for _, c := range id[min(len(id), 3):] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("checkpoint_id %q: not a checkpoint ID (ck- and 12 hexadecimal digits, as checkpoint returns): %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

func (s *Server) checkpoint(ctx context.Context, a checkpointArgs) (*sdk.CallToolResult, checkpointInfo, error) {
	if len(a.Message) > 1024 {
		return nil, checkpointInfo{}, fmt.Errorf("message: %d bytes, at most 1024: %w", len(a.Message), errdefs.ErrInvalidArgument)
	}
	if a.Keep < 0 {
		return nil, checkpointInfo{}, fmt.Errorf("keep %d: want 0 (all) or more: %w", a.Keep, errdefs.ErrInvalidArgument)
	}
	if err := checkRef(a.SandboxID); err != nil {
		return nil, checkpointInfo{}, err
	}
	in, err := s.be.checkpoint(ctx, a.SandboxID, a.Message, a.Keep)
	return nil, in, err
}

func (s *Server) listCheckpoints(ctx context.Context, a sandboxArg) (*sdk.CallToolResult, checkpointList, error) {
	if err := checkRef(a.SandboxID); err != nil {
		return nil, checkpointList{}, err
	}
	cks, err := s.be.checkpoints(ctx, a.SandboxID)
	if cks == nil {
		cks = []checkpointInfo{}
	}
	return nil, checkpointList{Checkpoints: cks}, err
}

func (s *Server) restoreCheckpoint(ctx context.Context, a restoreArgs) (*sdk.CallToolResult, sandboxInfo, error) {
	if err := checkCheckpointID(a.CheckpointID); err != nil {
		return nil, sandboxInfo{}, err
	}
	if err := checkRef(a.SandboxID); err != nil {
		return nil, sandboxInfo{}, err
	}
	in, err := s.be.restore(ctx, a.SandboxID, a.CheckpointID)
	return nil, in, err
}

func (s *Server) diffCheckpoints(ctx context.Context, a diffArgs) (*sdk.CallToolResult, changeList, error) {
	if err := checkCheckpointID(a.From); err != nil {
		return nil, changeList{}, err
	}
	if a.To != "" {
		if err := checkCheckpointID(a.To); err != nil {
			return nil, changeList{}, err
		}
	}
	if err := checkRef(a.SandboxID); err != nil {
		return nil, changeList{}, err
	}
	chs, err := s.be.diffCheckpoints(ctx, a.SandboxID, a.From, a.To)
	if chs == nil {
		chs = []changeInfo{}
	}
	return nil, changeList{Changes: chs}, err
}
