package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
)

// The project was called sbx before it was called hutch. A host that ran
// sbx keeps its state under sbx's paths; hutch finds it there and names
// the command that moves it (MigrateFormerState), rather than starting an
// empty state root beside it.

// FormerName is the project's former name, in every default path.
const FormerName = "sbx"

// MigrateCommand is the command that moves a former state root.
const MigrateCommand = "hutch migrate"

// formerDefaultRoot is DefaultRoot as the former name had it, without its
// environment override (a user who set it sets HUTCH_ROOT now).
func formerDefaultRoot() string {
	if os.Geteuid() == 0 {
		return filepath.Join("/var/lib", FormerName)
	}
	if x := os.Getenv("XDG_DATA_HOME"); x != "" {
		return filepath.Join(x, FormerName)
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".local", "share", FormerName)
}

// formerMoves are the directories a migration moves, old then new: the
// state root, and as root the shared image store and the configuration.
func formerMoves() [][2]string {
	moves := [][2]string{{formerDefaultRoot(), DefaultRoot()}}
	if os.Geteuid() == 0 {
		moves = append(moves,
			[2]string{"/var/lib/" + FormerName + "-images", DefaultSharedImages},
			[2]string{"/etc/" + FormerName, "/etc/hutch"})
	}
	return moves
}

// FormerStateError says that the default state root is missing and the
// former name's is there: the host ran sbx.
type FormerStateError struct{ Old, New string }

func (e *FormerStateError) Error() string {
	return fmt.Sprintf("state of sbx (this project's former name) is at %s and none at %s: move it there with `%s`", e.Old, e.New, MigrateCommand)
}

// Unwrap makes the error a failed precondition.
func (e *FormerStateError) Unwrap() error { return errdefs.ErrFailedPrecondition }

// CheckFormerState returns a *FormerStateError when the default state
// root (chosen with no HUTCH_ROOT) does not exist and the former name's
// does; nil otherwise. root is the root about to be opened.
func CheckFormerState(root string) error {
	if os.Getenv("HUTCH_ROOT") != "" || root != DefaultRoot() {
		return nil
	}
	old := formerDefaultRoot()
	if old == "" {
		return nil
	}
	if _, err := os.Lstat(root); !errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if fi, err := os.Lstat(old); err != nil || !fi.IsDir() {
		return nil
	}
	return &FormerStateError{Old: old, New: root}
}

// Migrated is one directory MigrateFormerState moved.
type Migrated struct {
	From, To string
	// Rewritten counts the files whose recorded paths it changed.
	Rewritten int
}

// MigrateFormerState moves the former name's state root (and, as root, its
// shared image store and configuration) to hutch's default paths, and
// rewrites the absolute paths the state records so that every sandbox,
// image and volume is found there. It refuses, changing nothing, while a
// sandbox of the former root runs: a running sandbox's runtime holds its
// paths open. A paused or stopped sandbox moves with the rest.
func MigrateFormerState(ctx context.Context, o Options) ([]Migrated, error) {
	var todo [][2]string
	for _, m := range formerMoves() {
		if m[0] == "" {
			continue
		}
		fi, err := os.Lstat(m[0])
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("%s is not a directory: %w", m[0], errdefs.ErrFailedPrecondition)
		}
		if _, err := os.Lstat(m[1]); err == nil {
			return nil, fmt.Errorf("both %s and %s exist: move or remove one of them by hand: %w", m[0], m[1], errdefs.ErrAlreadyExists)
		}
		todo = append(todo, m)
	}
	if len(todo) == 0 || todo[0][0] != formerDefaultRoot() {
		return nil, fmt.Errorf("no state of sbx at %s to move: %w", formerDefaultRoot(), errdefs.ErrNotFound)
	}
	old := todo[0][0]
	o.Root = old
	e, err := Open(o)
	if err != nil {
		return nil, err
	}
	list, err := e.List(ctx)
	if err != nil {
		return nil, err
	}
	var live []string
	for _, sb := range list {
		if sb.State == StateRunning || sb.State == StateCreating {
			live = append(live, sb.ShortID())
		}
	}
	if len(live) > 0 {
		return nil, fmt.Errorf("sandboxes of %s are running (%s): stop or pause them first (hutch --root %s pause ID): %w",
			old, strings.Join(live, ", "), old, errdefs.ErrFailedPrecondition)
	}
	if err := e.StopBuilder(ctx); err != nil {
		return nil, fmt.Errorf("stopping the image builder of %s: %w", old, err)
	}
	var done []Migrated
	for _, m := range todo {
		if err := os.MkdirAll(filepath.Dir(m[1]), 0o755); err != nil {
			return done, err
		}
		if err := os.Rename(m[0], m[1]); err != nil {
			return done, fmt.Errorf("moving %s: %w", m[0], err)
		}
		n, err := rewritePaths(m[1], m[0], m[1])
		done = append(done, Migrated{From: m[0], To: m[1], Rewritten: n})
		if err != nil {
			return done, fmt.Errorf("rewriting the paths under %s: %w", m[1], err)
		}
	}
	if err := renameShimConfig(); err != nil {
		return done, err
	}
	return done, nil
}

// renameShimConfig gives the shim's configuration file, moved with /etc,
// the name the renamed shim reads.
func renameShimConfig() error {
	if os.Geteuid() != 0 {
		return nil
	}
	old := filepath.Join("/etc/hutch", "containerd-shim-"+FormerName+"-v1.toml")
	if _, err := os.Lstat(old); err != nil {
		return nil
	}
	if err := os.Rename(old, filepath.Join("/etc/hutch", "containerd-shim-hutch-v1.toml")); err != nil {
		return fmt.Errorf("renaming the shim's configuration: %w", err)
	}
	return nil
}

// rewritePaths replaces the absolute paths below old with the same paths
// below new in the state under dir: in the JSON documents the engine
// writes (sandbox records, bundles, pools, workspaces, volumes) and in
// symbolic links. Content-addressed blobs are left alone: their names are
// the digests of their bytes, and no path of the state root is in them.
// It returns how many files it changed.
func rewritePaths(dir, old, new string) (int, error) {
	oldJ, newJ := jsonString(old), jsonString(new)
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "blobs" {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type()&fs.ModeSymlink != 0 {
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if nt, ok := underNew(t, old, new); ok {
				if err := os.Remove(p); err != nil {
					return err
				}
				if err := os.Symlink(nt, p); err != nil {
					return err
				}
				n++
			}
			return nil
		}
		if !d.Type().IsRegular() || !strings.HasSuffix(d.Name(), ".json") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		nb := replaceJSONPaths(b, oldJ, newJ)
		if bytes.Equal(nb, b) {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		tmp := p + ".migrate"
		if err := os.WriteFile(tmp, nb, fi.Mode().Perm()); err != nil {
			return err
		}
		if err := os.Rename(tmp, p); err != nil {
			return err
		}
		n++
		return nil
	})
	return n, err
}

// underNew is path p moved from below old to below new, if it was there.
func underNew(p, old, new string) (string, bool) {
	if p == old {
		return new, true
	}
	if rest, ok := strings.CutPrefix(p, old+"/"); ok {
		return new + "/" + rest, true
	}
	return "", false
}

// jsonString is s as it appears inside a JSON string, without the quotes.
func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b[1 : len(b)-1])
}

// replaceJSONPaths replaces, in the JSON document b, each string that is
// old or begins with old + "/" by the same string with new in its place.
// old and new are as they appear inside JSON strings.
func replaceJSONPaths(b []byte, old, new string) []byte {
	var out bytes.Buffer
	for {
		i := bytes.Index(b, []byte(`"`+old))
		if i < 0 {
			out.Write(b)
			return out.Bytes()
		}
		j := i + 1 + len(old)
		if j < len(b) && (b[j] == '"' || b[j] == '/') {
			out.Write(b[:i+1])
			out.WriteString(new)
		} else {
			out.Write(b[:j])
		}
		b = b[j:]
	}
}
