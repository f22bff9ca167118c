package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	bootapi "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	eventsapi "github.com/containerd/containerd/api/services/ttrpc/events/v1"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"

	"hutch.dev/hutch/runsc"
)

// fakeContainerd is the events service a shim publishes to, recording
// what it receives.
type fakeContainerd struct {
	mu     sync.Mutex // guards events
	events []recvEvent
}

type recvEvent struct {
	topic string
	ev    any
}

func (f *fakeContainerd) Forward(ctx context.Context, r *eventsapi.ForwardRequest) (*emptypb.Empty, error) {
	ev, err := typeurl.UnmarshalAny(r.Envelope.Event)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.events = append(f.events, recvEvent{r.Envelope.Topic, ev})
	f.mu.Unlock()
	return &emptypb.Empty{}, nil
}

func (f *fakeContainerd) topics() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, e := range f.events {
		out = append(out, e.topic)
	}
	return out
}

// The real shim binary against a fake containerd: started through the
// bootstrap protocol, driven over ttrpc, it publishes create, start, the
// exec's events, the exec's exit before the init's, and delete, in that
// order, with the exit statuses the processes had.
func TestShimEvents(t *testing.T) {
	requiresRoot(t)
	bin := binDir(t)
	shimBin := filepath.Join(bin, "containerd-shim-hutch-v1")
	if _, err := os.Stat(shimBin); err != nil {
		t.Fatalf("shim not built (run `make shim`): %v", err)
	}
	dir := t.TempDir()

	// The fake containerd's events socket.
	fake := &fakeContainerd{}
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	eventsapi.RegisterTTRPCEventsService(srv, fake)
	evSock := filepath.Join(dir, "events.sock")
	l, err := net.Listen("unix", evSock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(context.Background(), l) //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })

	// A bundle, named after the task as containerd names it: busybox as
	// the rootfs, the shim's log fifo, a config.
	const ns, id = "shimtest", "task1"
	bundle := filepath.Join(dir, id)
	rootfs := filepath.Join(bundle, "rootfs")
	for _, d := range []string{"bin", "proc", "dev", "sys", "tmp"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(t, "/bin/busybox", filepath.Join(rootfs, "bin", "busybox"))
	if err := os.Chmod(filepath.Join(rootfs, "bin", "busybox"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"sh", "sleep", "echo"} {
		if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	spec := runsc.Spec(runsc.SpecConfig{
		Rootfs: "rootfs", Hostname: "shimtest",
		Process: specs.Process{Args: []string{"sleep", "1000"}, Env: []string{"PATH=/bin"}, Cwd: "/"},
	})
	if err := runsc.WriteBundle(bundle, spec); err != nil {
		t.Fatal(err)
	}
	logFifo := filepath.Join(bundle, "log")
	if err := syscall.Mkfifo(logFifo, 0o600); err != nil {
		t.Fatal(err)
	}
	logR, err := os.OpenFile(logFifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	var shimLog bytes.Buffer
	var logMu sync.Mutex
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := logR.Read(buf)
			logMu.Lock()
			shimLog.Write(buf[:n])
			logMu.Unlock()
			if err != nil && n == 0 {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}()
	t.Cleanup(func() {
		if t.Failed() {
			logMu.Lock()
			t.Logf("shim log:\n%s", shimLog.String())
			logMu.Unlock()
		}
	})
	shimConfig := filepath.Join(dir, "shim.toml")
	if err := os.WriteFile(shimConfig, []byte("runsc_root = \""+filepath.Join(dir, "runsc")+"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	// Start the shim as containerd does: `start` with bootstrap
	// parameters on stdin, the result on stdout.
	socketDir := filepath.Join(dir, "s")
	params, err := proto.Marshal(&bootapi.BootstrapParams{
		InstanceID: id, Namespace: ns, ContainerdTtrpcAddress: "unix://" + evSock,
		ContainerdGrpcAddress: filepath.Join(dir, "containerd.sock"), SocketDir: &socketDir,
	})
	if err != nil {
		t.Fatal(err)
	}
	start := exec.Command(shimBin, "-namespace", ns, "-id", id, "-address", filepath.Join(dir, "containerd.sock"), "start")
	start.Dir = bundle
	start.Env = append(os.Environ(), "TTRPC_ADDRESS=unix://"+evSock)
	start.Stdin = bytes.NewReader(params)
	out, err := start.Output()
	if err != nil {
		t.Fatalf("shim start: %v: %s", err, out)
	}
	var res bootapi.BootstrapResult
	if err := proto.Unmarshal(out, &res); err != nil {
		t.Fatalf("bootstrap result: %v", err)
	}
	conn, err := net.Dial("unix", strings.TrimPrefix(res.Address, "unix://"))
	if err != nil {
		t.Fatalf("connect to the shim at %s: %v", res.Address, err)
	}
	client := ttrpc.NewClient(conn)
	defer client.Close()
	task := taskAPI.NewTTRPCTaskClient(client)
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), ns), time.Minute)
	defer cancel()

	opts, err := typeurl.MarshalAnyToProto(&runtimeoptions.Options{ConfigPath: shimConfig})
	if err != nil {
		t.Fatal(err)
	}
	stdout := filepath.Join(dir, "exec.out")
	cr, err := task.Create(ctx, &taskAPI.CreateTaskRequest{ID: id, Bundle: bundle, Options: opts})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	connect, err := task.Connect(ctx, &taskAPI.ConnectRequest{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// As containerd does when a shim is gone: `delete` cleans up.
		syscall.Kill(int(connect.ShimPid), syscall.SIGKILL) //nolint:errcheck // if still there
		del := exec.Command(shimBin, "-namespace", ns, "-id", id, "delete")
		del.Dir = bundle
		del.Run() //nolint:errcheck // best effort
	})
	if _, err := task.Start(ctx, &taskAPI.StartRequest{ID: id}); err != nil {
		t.Fatalf("start: %v", err)
	}
	// containerd sends the exec's process spec as JSON.
	ps, err := json.Marshal(&specs.Process{Args: []string{"sh", "-c", "echo from-exec; exit 4"}, Env: []string{"PATH=/bin"}, Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	execSpec := &anypb.Any{TypeUrl: "types.containerd.io/opencontainers/runtime-spec/1/Process", Value: ps}
	if _, err := task.Exec(ctx, &taskAPI.ExecProcessRequest{ID: id, ExecID: "x1", Spec: execSpec, Stdout: stdout}); err != nil {
		t.Fatalf("exec: %v", err)
	}
	if _, err := task.Start(ctx, &taskAPI.StartRequest{ID: id, ExecID: "x1"}); err != nil {
		t.Fatalf("start exec: %v", err)
	}
	w, err := task.Wait(ctx, &taskAPI.WaitRequest{ID: id, ExecID: "x1"})
	if err != nil || w.ExitStatus != 4 {
		t.Fatalf("wait exec: want status 4, got %v, %v", w, err)
	}
	if b, _ := os.ReadFile(stdout); string(b) != "from-exec\n" {
		t.Fatalf("exec output: %q", b)
	}
	if _, err := task.Delete(ctx, &taskAPI.DeleteRequest{ID: id, ExecID: "x1"}); err != nil {
		t.Fatalf("delete exec: %v", err)
	}
	// An exec still running when the sandbox goes: its exit comes
	// before the init's.
	long := &anypb.Any{TypeUrl: execSpec.TypeUrl, Value: []byte(`{"args":["sleep","1000"],"env":["PATH=/bin"],"cwd":"/"}`)}
	if _, err := task.Exec(ctx, &taskAPI.ExecProcessRequest{ID: id, ExecID: "x2", Spec: long}); err != nil {
		t.Fatalf("exec: %v", err)
	}
	if _, err := task.Start(ctx, &taskAPI.StartRequest{ID: id, ExecID: "x2"}); err != nil {
		t.Fatalf("start exec: %v", err)
	}
	if _, err := task.Kill(ctx, &taskAPI.KillRequest{ID: id, Signal: uint32(syscall.SIGKILL)}); err != nil {
		t.Fatalf("kill: %v", err)
	}
	if w, err = task.Wait(ctx, &taskAPI.WaitRequest{ID: id}); err != nil || w.ExitStatus != 137 {
		t.Fatalf("wait: want status 137, got %v, %v", w, err)
	}
	if _, err := task.Delete(ctx, &taskAPI.DeleteRequest{ID: id}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	task.Shutdown(ctx, &taskAPI.ShutdownRequest{ID: id}) //nolint:errcheck // the connection drops as the shim exits

	want := []string{"/tasks/create", "/tasks/start",
		"/tasks/exec-added", "/tasks/exec-started", "/tasks/exit",
		"/tasks/exec-added", "/tasks/exec-started", "/tasks/exit", "/tasks/exit", "/tasks/delete"}
	for i := 0; i < 100 && len(fake.topics()) < len(want); i++ {
		time.Sleep(100 * time.Millisecond)
	}
	if got := fake.topics(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("events: want %v, got %v", want, got)
	}
	fake.mu.Lock()
	execExit, _ := fake.events[4].ev.(*eventstypes.TaskExit)
	longExit, _ := fake.events[7].ev.(*eventstypes.TaskExit)
	initExit, _ := fake.events[8].ev.(*eventstypes.TaskExit)
	started, _ := fake.events[1].ev.(*eventstypes.TaskStart)
	fake.mu.Unlock()
	if execExit == nil || execExit.ID != "x1" || execExit.ExitStatus != 4 {
		t.Fatalf("first exit is not the exec's with status 4: %+v", execExit)
	}
	if longExit == nil || longExit.ID != "x2" || longExit.ExitStatus != 137 {
		t.Fatalf("the running exec's exit (137) is not before the init's: %+v", longExit)
	}
	if initExit == nil || initExit.ID != id || initExit.ExitStatus != 137 || started == nil || initExit.Pid != started.Pid || started.Pid != cr.Pid {
		t.Fatalf("init exit: %+v (start %+v, create pid %d)", initExit, started, cr.Pid)
	}
	// The shim exits after Shutdown and leaves nothing of the sandbox.
	waitFor(t, func() bool { return syscall.Kill(int(connect.ShimPid), 0) != nil })
	if left := processesMentioning(dir); len(left) > 0 {
		t.Fatalf("left behind:\n%s", strings.Join(left, "\n"))
	}
}
