package serve

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
)

var (
	envKeyRE   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	stepUserRE = regexp.MustCompile(`^([a-z_][a-z0-9_-]*[$]?|[0-9]+)(:([a-z_][a-z0-9_-]*|[0-9]+))?$`)
	modeRE     = regexp.MustCompile(`^0?[0-7]{3,4}$`)
)

// writeContext writes a build's context into dir: a Dockerfile of its
// steps FROM base, and the files its COPY steps name, taken from the
// tenant's uploads. It returns E2B's step name of each Dockerfile
// instruction, then "finalize" (the start command). A step it cannot
// build answers 400 naming it.
func (s *Server) writeContext(dir, tenantName, base, user string, body buildStart) ([]string, error) {
	var df strings.Builder
	steps := []string{"base"}
	add := func(step, line string) {
		df.WriteString(line + "\n")
		steps = append(steps, step)
	}
	df.WriteString("FROM " + base + "\n")
	restore := user
	if restore == "" {
		restore = "root"
	}
	extracted := map[string]bool{}
	for i, st := range body.Steps {
		name := strconv.Itoa(i + 1)
		bad := func(why string) ([]string, error) {
			return nil, fmt.Errorf("step %d (%s %q): %s: %w", i+1, st.Type, clip(strings.Join(st.Args, " "), 200), why, errdefs.ErrInvalidArgument)
		}
		for _, a := range st.Args {
			if strings.ContainsRune(a, 0) {
				return bad("a NUL byte in an argument")
			}
		}
		switch st.Type {
		case "RUN":
			if len(st.Args) < 1 || len(st.Args) > 2 || strings.TrimSpace(st.Args[0]) == "" {
				return bad("want [command] or [command, user]")
			}
			as := ""
			if len(st.Args) == 2 {
				as = st.Args[1]
			}
			if as != "" && !stepUserRE.MatchString(as) {
				return bad("not a user name or UID[:GID]")
			}
			run := "RUN " + jsonArgs("/bin/sh", "-c", st.Args[0])
			if as == "" || as == restore {
				add(name, run)
				continue
			}
			add(name, "USER "+as)
			add(name, run)
			add(name, "USER "+restore)
		case "COPY":
			if len(st.Args) < 2 || len(st.Args) > 4 {
				return bad("want [src, dest, user, mode]")
			}
			src, dest := st.Args[0], st.Args[1]
			if src == "" || path.IsAbs(src) || strings.HasPrefix(path.Clean(src), "..") {
				return bad("the source must be a path inside the build's context")
			}
			if dest == "" || strings.ContainsAny(dest, "\n") {
				return bad("no destination")
			}
			if !filesHashRE.MatchString(st.FilesHash) {
				return bad("no filesHash of 64 hex digits (the SDK sends it)")
			}
			if !extracted[st.FilesHash] {
				if err := s.extractUpload(tenantName, st.FilesHash, filepath.Join(dir, "files", st.FilesHash)); err != nil {
					return nil, fmt.Errorf("step %d (COPY %s): %w", i+1, clip(src, 200), err)
				}
				extracted[st.FilesHash] = true
			}
			line := "COPY"
			if len(st.Args) > 2 && st.Args[2] != "" {
				if !stepUserRE.MatchString(st.Args[2]) {
					return bad("not a user name or UID[:GID]")
				}
				line += " --chown=" + st.Args[2]
			}
			if len(st.Args) > 3 && st.Args[3] != "" {
				if !modeRE.MatchString(st.Args[3]) {
					return bad("not an octal mode")
				}
				line += " --chmod=" + st.Args[3]
			}
			add(name, line+" "+jsonArgs("files/"+st.FilesHash+"/"+path.Clean(src), dest))
		case "ENV":
			if len(st.Args) == 0 || len(st.Args)%2 != 0 {
				return bad("want [key, value, ...]")
			}
			var kv []string
			for j := 0; j < len(st.Args); j += 2 {
				k, v := st.Args[j], st.Args[j+1]
				if !envKeyRE.MatchString(k) {
					return bad(fmt.Sprintf("%q is not a variable name", k))
				}
				if strings.ContainsAny(v, "\n\r") {
					return bad("a value with a line break")
				}
				kv = append(kv, k+"="+strconv.Quote(v))
			}
			add(name, "ENV "+strings.Join(kv, " "))
		case "WORKDIR":
			if len(st.Args) != 1 || st.Args[0] == "" || strings.ContainsAny(st.Args[0], "\n\r") {
				return bad("want [directory]")
			}
			add(name, "WORKDIR "+st.Args[0])
		case "USER":
			if len(st.Args) != 1 || !stepUserRE.MatchString(st.Args[0]) {
				return bad("want [user], a user name or UID[:GID]")
			}
			restore = st.Args[0]
			add(name, "USER "+restore)
		default:
			return bad("a step of this type is not supported (RUN, COPY, ENV, WORKDIR, USER)")
		}
	}
	steps = append(steps, "finalize")
	return steps, os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(df.String()), 0o600)
}

// jsonArgs is a Dockerfile instruction's JSON (exec) form of args.
func jsonArgs(args ...string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = strconv.Quote(a)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// maxExtract bounds what one upload may unpack to.
const maxExtract = 4 << 30

// extractUpload unpacks the tenant's upload of hash (a tar, gzipped or
// not) into dir, which it makes. Every path stays inside dir (os.Root):
// absolute names, "..", links out and devices are refused.
func (s *Server) extractUpload(tenantName, hash, dir string) error {
	f, err := os.Open(filepath.Join(s.buildFilesDir(tenantName), hash+".tar"))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("files %s were not uploaded (GET /templates/{templateID}/files/%s gives the upload URL): %w", hash[:12], hash, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("files %s: %v: %w", hash[:12], err, errdefs.ErrInvalidArgument)
		}
		defer gz.Close()
		r = gz
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	var total int64
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("files %s: not a tar archive: %v: %w", hash[:12], err, errdefs.ErrInvalidArgument)
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if name == "." {
			continue
		}
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("files %s: %q is outside the context: %w", hash[:12], clip(h.Name, 200), errdefs.ErrInvalidArgument)
		}
		if d := path.Dir(name); d != "." {
			if err := root.MkdirAll(d, 0o755); err != nil {
				return fmt.Errorf("files %s: %s: %w", hash[:12], clip(name, 200), err)
			}
		}
		mode := fs.FileMode(h.Mode) & fs.ModePerm
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, mode|0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			total += h.Size
			if total > maxExtract {
				return fmt.Errorf("files %s unpack to more than %d bytes: %w", hash[:12], int64(maxExtract), errdefs.ErrInvalidArgument)
			}
			out, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
			if err != nil {
				return fmt.Errorf("files %s: %s: %w", hash[:12], clip(name, 200), err)
			}
			_, err = io.Copy(out, io.LimitReader(tr, h.Size))
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			// A link is copied into the image as it is; it may point
			// anywhere there, but is never followed here.
			if err := root.Symlink(h.Linkname, name); err != nil {
				return fmt.Errorf("files %s: %s: %w", hash[:12], clip(name, 200), err)
			}
		default:
			return fmt.Errorf("files %s: %s is a %c entry: only files, directories and symlinks: %w", hash[:12], clip(name, 200), h.Typeflag, errdefs.ErrInvalidArgument)
		}
	}
}
