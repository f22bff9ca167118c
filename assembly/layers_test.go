package assembly

import (
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "hutch.dev/hutch"

// listedPackage is what `go list -json` says of a package.
type listedPackage struct {
	ImportPath   string
	Name         string
	Dir          string
	GoFiles      []string
	Imports      []string
	TestImports  []string
	XTestImports []string
	Deps         []string
}

// allImports are p's imports, its tests' included.
func (p listedPackage) allImports() []string {
	return slices.Concat(p.Imports, p.TestImports, p.XTestImports)
}

// listPackages lists the module's packages (tests excluded).
func listPackages(t *testing.T) map[string]listedPackage {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	// Every top-level directory but bin/, which holds build outputs
	// (image build state with whole root filesystems) that go list
	// would walk.
	ents, err := os.ReadDir("..")
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"list", "-json"}
	for _, e := range ents {
		if e.IsDir() && e.Name() != "bin" && !strings.HasPrefix(e.Name(), ".") && !strings.HasPrefix(e.Name(), "_") {
			args = append(args, module+"/"+e.Name()+"/...")
		}
	}
	cmd := exec.Command(goCmd, args...)
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v: %s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string]listedPackage{}
	d := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p listedPackage
		if err := d.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs[p.ImportPath] = p
	}
	return pkgs
}

// under reports whether package path is dir or below it (dir relative to
// the module, "" the module itself).
func under(path, dir string) bool {
	full := module
	if dir != "" {
		full += "/" + dir
	}
	return path == full || strings.HasPrefix(path, full+"/")
}

// The module's import rules, checked on the module as it is.
func TestImportRules(t *testing.T) {
	// The agent's wire packages: all the host knows of the agent, the
	// protocol it speaks to it and the tar stream of cp.
	wire := map[string]bool{
		module + "/agent/wire":     true,
		module + "/agent/archive":  true,
		module + "/agent/agentnet": true,
		module + "/agent/ptywire":  true,
	}
	pkgs := listPackages(t)
	if len(pkgs) < 10 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	for w := range wire {
		if _, ok := pkgs[w]; !ok {
			t.Errorf("no package %s", w)
		}
		for _, d := range pkgs[w].allImports() {
			if under(d, "") && !wire[d] {
				t.Errorf("wire package %s imports %s", w, d)
			}
		}
	}
	for path, p := range pkgs {
		// The agent runs inside the sandbox: it imports nothing of the
		// host.
		if under(path, "agent") {
			for _, d := range p.allImports() {
				if under(d, "") && !under(d, "agent") {
					t.Errorf("%s imports %s", path, d)
				}
			}
		}
		// The host knows the agent only through its wire packages;
		// cmd/hutch-init is the agent's binary.
		if !under(path, "agent") && path != module+"/cmd/hutch-init" {
			for _, d := range p.allImports() {
				if under(d, "agent") && !wire[d] {
					t.Errorf("%s imports %s", path, d)
				}
			}
		}
		// credential makes and checks credentials; what they open is
		// its callers' business.
		if under(path, "credential") {
			for _, d := range p.allImports() {
				if under(d, "") && !under(d, "credential") {
					t.Errorf("%s imports %s", path, d)
				}
			}
		}
		// The egress gateway judges by policy and dials; it knows
		// nothing of how a sandbox is made.
		if under(path, "egress") {
			for _, d := range p.allImports() {
				if under(d, "") && !under(d, "egress") && !under(d, "policy") {
					t.Errorf("%s imports %s", path, d)
				}
			}
		}
		// runsc runs what it is given.
		if under(path, "runsc") {
			for _, d := range p.Deps {
				for _, bad := range []string{"policy", "overlay", "buildimg", "assembly"} {
					if under(d, bad) {
						t.Errorf("%s depends on %s", path, d)
					}
				}
			}
		}
		// Nothing imports cmd/.
		if !under(path, "cmd") {
			for _, d := range p.Imports {
				if under(d, "cmd") {
					t.Errorf("%s imports %s", path, d)
				}
			}
		}
		// The CLI holds flags and output; it reaches the sandbox through
		// engine only.
		if under(path, "cmd/hutch") {
			for _, d := range p.Imports {
				for _, bad := range []string{"policy", "overlay", "assembly", "runsc"} {
					if under(d, bad) {
						t.Errorf("%s imports %s", path, d)
					}
				}
			}
		}
		// A package is named as its directory, so that it is imported
		// without an alias; commands are main.
		if p.Name != "main" && p.Name != filepath.Base(p.Dir) {
			t.Errorf("%s is package %s, in directory %s", path, p.Name, filepath.Base(p.Dir))
		}
		// serve/ and mcp/ use engine's API; the sandbox's assembly is
		// engine's business. The agent's wire packages are not: serve's
		// Kubernetes placement speaks them to a pod's agent itself
		// (docs/decisions/0025); they run nothing and import nothing of
		// hutch but each other.
		if under(path, "serve") || under(path, "mcp") {
			for _, d := range p.Imports {
				if wire[d] {
					continue
				}
				if under(d, "runsc") || under(d, "assembly") {
					t.Errorf("%s imports %s", path, d)
				}
			}
		}
	}
	for _, front := range []string{"serve", "mcp"} {
		if !slices.Contains(pkgs[module+"/"+front].Imports, module+"/engine") {
			t.Errorf("%s does not use engine", front)
		}
	}
}

// policy/ is pure: it imports nothing that runs a command, and calls
// nothing that opens a socket or starts a process.
func TestPolicyIsPure(t *testing.T) {
	pkgs := listPackages(t)
	forbidden := map[string][]string{
		"os/exec": nil, // any use
		"net":     {"Listen", "ListenPacket", "ListenTCP", "ListenUDP", "ListenUnix", "ListenIP", "Dial", "DialTCP", "DialUDP", "DialUnix", "DialIP", "DialTimeout", "FileListener", "FileConn"},
		"syscall": {"Exec", "ForkExec", "StartProcess", "Socket", "Bind", "Listen", "Mount", "Unshare", "Setns"},
		"os":      {"StartProcess"},
		"golang.org/x/sys/unix": {"Exec", "Socket", "Bind", "Listen", "Connect", "Mount", "Unshare", "Setns",
			"Syscall", "Syscall6", "RawSyscall", "RawSyscall6"},
	}
	checked := 0
	for path, p := range pkgs {
		if !under(path, "policy") {
			continue
		}
		checked++
		if slices.Contains(p.Imports, "os/exec") {
			t.Errorf("%s imports os/exec", path)
		}
		for _, f := range p.GoFiles {
			file, err := parser.ParseFile(token.NewFileSet(), filepath.Join(p.Dir, f), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			names := map[string]string{} // local name -> import path
			for _, imp := range file.Imports {
				ip, _ := strconv.Unquote(imp.Path.Value)
				if _, ok := forbidden[ip]; !ok {
					continue
				}
				name := ip[strings.LastIndex(ip, "/")+1:]
				if imp.Name != nil {
					name = imp.Name.Name
				}
				names[name] = ip
			}
			ast.Inspect(file, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				x, ok := sel.X.(*ast.Ident)
				if !ok {
					return true
				}
				if ip, ok := names[x.Name]; ok {
					if fs := forbidden[ip]; fs == nil || slices.Contains(fs, sel.Sel.Name) {
						t.Errorf("%s/%s uses %s.%s", path, f, ip, sel.Sel.Name)
					}
				}
				return true
			})
		}
	}
	if checked == 0 {
		t.Fatal("no policy package checked")
	}
}

// serve's handlers do not ask which backend places the sandboxes: only
// serve.New picks one from its Config (Kube or Engine), only server.go
// names the Kubernetes backend, and nothing asserts a placement to a
// backend's type. The backends do not import serve.
func TestServeOneBackendChoice(t *testing.T) {
	pkgs := listPackages(t)
	serve, ok := pkgs[module+"/serve"]
	if !ok {
		t.Fatal("no package serve")
	}
	for _, d := range []string{"serve/kubeplace", "serve/placement"} {
		if slices.Contains(pkgs[module+"/"+d].Deps, module+"/serve") {
			t.Errorf("%s depends on serve", d)
		}
	}
	backendTypes := []string{"hostPlacement", "Placement"}
	for _, f := range serve.GoFiles {
		file, err := parser.ParseFile(token.NewFileSet(), filepath.Join(serve.Dir, f), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range file.Imports {
			if ip, _ := strconv.Unquote(imp.Path.Value); ip == module+"/serve/kubeplace" && f != "server.go" {
				t.Errorf("serve/%s imports %s: only New chooses the backend", f, ip)
			}
		}
		for _, decl := range file.Decls {
			fn, isFunc := decl.(*ast.FuncDecl)
			inNew := isFunc && fn.Recv == nil && fn.Name.Name == "New" && f == "server.go"
			ast.Inspect(decl, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.SelectorExpr:
					// cfg.Kube, s.cfg.Engine: which backend the
					// server was given (not the type engine.Engine).
					if x, ok := n.X.(*ast.Ident); ok && x.Name == "engine" {
						return true
					}
					if (n.Sel.Name == "Kube" || n.Sel.Name == "Engine") && !inNew {
						t.Errorf("serve/%s reads Config.%s outside New", f, n.Sel.Name)
					}
				case *ast.TypeAssertExpr:
					if n.Type != nil && mentions(n.Type, backendTypes) {
						t.Errorf("serve/%s asserts a placement to a backend's type", f)
					}
				case *ast.TypeSwitchStmt:
					ast.Inspect(n.Body, func(c ast.Node) bool {
						if cc, ok := c.(*ast.CaseClause); ok {
							for _, e := range cc.List {
								if mentions(e, backendTypes) {
									t.Errorf("serve/%s switches on a backend's type", f)
								}
							}
						}
						return true
					})
				}
				return true
			})
		}
	}
}

// mentions reports whether expression e names one of the types.
func mentions(e ast.Expr, types []string) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && slices.Contains(types, id.Name) {
			found = true
		}
		return !found
	})
	return found
}
