package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"

	"hutch.dev/hutch/agent/wire"
)

// The agent's SSH server. "sshd" serves one SSH connection on its stdin
// and stdout: the host runs it as root with one `runsc exec` per
// connection (`hutch ssh-proxy`, an OpenSSH ProxyCommand), so it needs no
// network and no sshd in the image. Before the SSH stream, the host sends
// a wire.SSHConfig frame (wire.WriteSSHConfig): the sandbox's host key
// and the public keys allowed in. Keys never touch the sandbox's filesystem.
//
// A session runs as the SSH user, a user of the sandbox's /etc/passwd,
// with that user's login shell: exec, shell, pty (allocated here from
// the sandbox's own /dev/ptmx), env, window-change, signal, exit-status,
// and the sftp subsystem ("sftp-server", run as the user).
// direct-tcpip (ssh -L) dials from inside the sandbox. Remote forwarding,
// agent forwarding and X11 are refused.

func init() {
	subcommands[wire.ModeSSHD] = sshdMain
	subcommands[wire.ModeSFTPServer] = sftpMain
}

// stdioConn is the agent's stdin and stdout as a net.Conn.
type stdioConn struct{ stdio }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "stdio" }

func (stdioConn) LocalAddr() net.Addr              { return pipeAddr{} }
func (stdioConn) RemoteAddr() net.Addr             { return pipeAddr{} }
func (stdioConn) SetDeadline(time.Time) error      { return nil }
func (stdioConn) SetReadDeadline(time.Time) error  { return nil }
func (stdioConn) SetWriteDeadline(time.Time) error { return nil }

// sshdMain is "sshd": one SSH connection on stdin/stdout.
func sshdMain(args []string) int {
	if len(args) != 0 {
		return usage("sshd")
	}
	cfg, err := wire.ReadSSHConfig(os.Stdin)
	if err != nil {
		return fail(err)
	}
	sc, err := serverConfig(cfg)
	if err != nil {
		return fail(err)
	}
	conn, chans, reqs, err := ssh.NewServerConn(stdioConn{}, sc)
	if err != nil {
		return fail(fmt.Errorf("ssh handshake: %w", err))
	}
	defer conn.Close()
	// Remote forwarding (tcpip-forward) and other global requests are
	// refused.
	go ssh.DiscardRequests(reqs)
	u := userFromPerms(conn.Permissions)
	var wg sync.WaitGroup
	for nc := range chans {
		switch nc.ChannelType() {
		case "session":
			ch, creqs, err := nc.Accept()
			if err != nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				(&session{ch: ch, user: u}).serve(creqs)
			}()
		case "direct-tcpip":
			wg.Add(1)
			go func() {
				defer wg.Done()
				directTCPIP(nc)
			}()
		default:
			nc.Reject(ssh.UnknownChannelType, "unsupported channel type "+nc.ChannelType())
		}
	}
	wg.Wait()
	return 0
}

func serverConfig(cfg wire.SSHConfig) (*ssh.ServerConfig, error) {
	hk, err := ssh.ParsePrivateKey(cfg.HostKey)
	if err != nil {
		return nil, fmt.Errorf("host key: %w", err)
	}
	allowed := map[string]bool{}
	for _, line := range cfg.AuthorizedKeys {
		k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
		if err != nil {
			return nil, fmt.Errorf("authorized key %q: %w", line, err)
		}
		allowed[string(k.Marshal())] = true
	}
	sc := &ssh.ServerConfig{
		PublicKeyCallback: func(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if !allowed[string(key.Marshal())] {
				return nil, errors.New("public key not authorized")
			}
			u, err := lookupUser(meta.User())
			if err != nil {
				return nil, err
			}
			return &ssh.Permissions{Extensions: u.extensions()}, nil
		},
		ServerVersion: "SSH-2.0-hutch",
	}
	sc.AddHostKey(hk)
	return sc, nil
}

// sshUser is an entry of the sandbox's /etc/passwd.
type sshUser struct {
	name, home, shell string
	uid, gid          uint32
}

func (u sshUser) extensions() map[string]string {
	return map[string]string{
		"name": u.name, "home": u.home, "shell": u.shell,
		"uid": strconv.FormatUint(uint64(u.uid), 10), "gid": strconv.FormatUint(uint64(u.gid), 10),
	}
}

func userFromPerms(p *ssh.Permissions) sshUser {
	x := p.Extensions
	uid, _ := strconv.ParseUint(x["uid"], 10, 32)
	gid, _ := strconv.ParseUint(x["gid"], 10, 32)
	return sshUser{name: x["name"], home: x["home"], shell: x["shell"], uid: uint32(uid), gid: uint32(gid)}
}

// lookupUser finds name in the sandbox's /etc/passwd.
func lookupUser(name string) (sshUser, error) {
	f, err := os.Open("/etc/passwd")
	if err != nil {
		return sshUser{}, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fs := strings.Split(s.Text(), ":")
		if len(fs) < 7 || fs[0] != name {
			continue
		}
		uid, err1 := strconv.ParseUint(fs[2], 10, 32)
		gid, err2 := strconv.ParseUint(fs[3], 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		u := sshUser{name: name, uid: uint32(uid), gid: uint32(gid), home: fs[5], shell: fs[6]}
		if u.home == "" {
			u.home = "/"
		}
		if fi, err := os.Stat(u.shell); u.shell == "" || err != nil || fi.IsDir() {
			u.shell = "/bin/sh"
		}
		return u, nil
	}
	return sshUser{}, fmt.Errorf("no user %q in the sandbox's /etc/passwd", name)
}

// session is one "session" channel: at most one command.
type session struct {
	ch   ssh.Channel
	user sshUser

	mu      sync.Mutex // guards the fields below
	env     []string
	ptyReq  *ptyRequest
	ptmx    *os.File
	cmd     *exec.Cmd
	started bool
}

type ptyRequest struct {
	Term          string
	Cols, Rows    uint32
	Width, Height uint32
	Modes         string
}

type winChange struct {
	Cols, Rows    uint32
	Width, Height uint32
}

func (s *session) serve(reqs <-chan *ssh.Request) {
	defer s.ch.Close()
	for req := range reqs {
		ok := false
		switch req.Type {
		case "env":
			var kv struct{ Name, Value string }
			if ssh.Unmarshal(req.Payload, &kv) == nil && kv.Name != "" && !strings.Contains(kv.Name, "=") {
				s.mu.Lock()
				s.env = append(s.env, kv.Name+"="+kv.Value)
				s.mu.Unlock()
				ok = true
			}
		case "pty-req":
			var p ptyRequest
			if ssh.Unmarshal(req.Payload, &p) == nil {
				s.mu.Lock()
				if !s.started {
					s.ptyReq, ok = &p, true
				}
				s.mu.Unlock()
			}
		case "window-change":
			var w winChange
			if ssh.Unmarshal(req.Payload, &w) == nil {
				s.mu.Lock()
				if s.ptmx != nil {
					pty.Setsize(s.ptmx, &pty.Winsize{Rows: uint16(w.Rows), Cols: uint16(w.Cols), X: uint16(w.Width), Y: uint16(w.Height)}) //nolint:errcheck // best effort
				} else if s.ptyReq != nil {
					s.ptyReq.Cols, s.ptyReq.Rows = w.Cols, w.Rows
				}
				s.mu.Unlock()
				ok = true
			}
		case "signal":
			var sig struct{ Name string }
			if ssh.Unmarshal(req.Payload, &sig) == nil {
				ok = s.signal(sig.Name)
			}
		case "shell", "exec", "subsystem":
			var argv []string
			sftpSub := false
			switch req.Type {
			case "shell":
				argv = []string{s.user.shell, "-l"}
			case "exec":
				var c struct{ Command string }
				if ssh.Unmarshal(req.Payload, &c) != nil {
					break
				}
				argv = []string{s.user.shell, "-c", c.Command}
			case "subsystem":
				var c struct{ Name string }
				if ssh.Unmarshal(req.Payload, &c) != nil || c.Name != "sftp" {
					break
				}
				argv, sftpSub = []string{wire.MountPath, "sftp-server"}, true
			}
			if argv == nil {
				break
			}
			s.mu.Lock()
			start := !s.started
			s.started = true
			s.mu.Unlock()
			if !start {
				break
			}
			if err := s.start(argv, req.Type == "shell", sftpSub); err != nil {
				fmt.Fprintf(s.ch.Stderr(), "hutch: %v\r\n", err)
				break
			}
			ok = true
		}
		if req.WantReply {
			req.Reply(ok, nil) //nolint:errcheck // the client may be gone
		}
	}
}

// signals are the SSH signal names (RFC 4254 6.10).
var signals = map[string]syscall.Signal{
	"ABRT": syscall.SIGABRT, "ALRM": syscall.SIGALRM, "FPE": syscall.SIGFPE,
	"HUP": syscall.SIGHUP, "ILL": syscall.SIGILL, "INT": syscall.SIGINT,
	"KILL": syscall.SIGKILL, "PIPE": syscall.SIGPIPE, "QUIT": syscall.SIGQUIT,
	"SEGV": syscall.SIGSEGV, "TERM": syscall.SIGTERM, "USR1": syscall.SIGUSR1,
	"USR2": syscall.SIGUSR2,
}

func signalName(sig syscall.Signal) string {
	for n, s := range signals {
		if s == sig {
			return n
		}
	}
	return strconv.Itoa(int(sig))
}

func (s *session) signal(name string) bool {
	sig, ok := signals[name]
	s.mu.Lock()
	defer s.mu.Unlock()
	if !ok || s.cmd == nil || s.cmd.Process == nil {
		return false
	}
	// The command leads its own process group.
	return syscall.Kill(-s.cmd.Process.Pid, sig) == nil
}

// environ is the session's environment: the agent's (the image's), the
// user's, then what the client sent.
func (s *session) environ() []string {
	u := s.user
	env := wire.MergeEnv(os.Environ(), []string{
		"HOME=" + u.home, "USER=" + u.name, "LOGNAME=" + u.name, "SHELL=" + u.shell,
		"SSH_CONNECTION=127.0.0.1 0 127.0.0.1 22", "SSH_CLIENT=127.0.0.1 0 22",
	})
	if s.ptyReq != nil && s.ptyReq.Term != "" {
		env = wire.MergeEnv(env, []string{"TERM=" + s.ptyReq.Term})
	}
	return wire.MergeEnv(env, s.env)
}

func (s *session) start(argv []string, login, sftpSub bool) error {
	u := s.user
	cmd := exec.Command(argv[0], argv[1:]...)
	if login {
		// A login shell, as sshd starts it: argv[0] begins with "-".
		cmd.Args[0] = "-" + baseName(argv[0])
		cmd.Args = cmd.Args[:1]
	}
	s.mu.Lock()
	cmd.Env = s.environ()
	pr := s.ptyReq
	s.mu.Unlock()
	cmd.Dir = u.home
	if fi, err := os.Stat(u.home); err != nil || !fi.IsDir() {
		cmd.Dir = "/"
	}
	cred := &syscall.Credential{Uid: u.uid, Gid: u.gid, NoSetGroups: u.uid == 0}
	if pr != nil && !sftpSub {
		return s.startPty(cmd, cred, pr)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = s.ch, s.ch.Stderr()
	if sftpSub {
		cmd.Stderr = io.Discard
	}
	// Output a background child keeps open ends the session after this.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return err
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	go func() {
		io.Copy(stdin, s.ch) //nolint:errcheck // either end may go away
		stdin.Close()
	}()
	go func() {
		cmd.Wait() //nolint:errcheck // exit reports the status
		s.exit(cmd)
	}()
	return nil
}

func baseName(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[i+1:]
	}
	return p
}

// startPty runs cmd on a new pty of the sandbox (its own /dev/ptmx), as
// the session leader with the pty as its controlling terminal.
func (s *session) startPty(cmd *exec.Cmd, cred *syscall.Credential, pr *ptyRequest) error {
	ptmx, tty, err := pty.Open()
	if err != nil {
		return fmt.Errorf("allocate a pty: %w", err)
	}
	defer tty.Close()
	// The user owns the terminal, as login(1) makes it.
	if err := tty.Chown(int(cred.Uid), int(cred.Gid)); err != nil {
		ptmx.Close()
		return fmt.Errorf("chown %s: %w", tty.Name(), err)
	}
	tty.Chmod(0o620) //nolint:errcheck // best effort
	if pr.Cols > 0 && pr.Rows > 0 {
		pty.Setsize(ptmx, &pty.Winsize{Rows: uint16(pr.Rows), Cols: uint16(pr.Cols), X: uint16(pr.Width), Y: uint16(pr.Height)}) //nolint:errcheck // best effort
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0, Credential: cred}
	if err := cmd.Start(); err != nil {
		ptmx.Close()
		return err
	}
	s.mu.Lock()
	s.cmd, s.ptmx = cmd, ptmx
	s.mu.Unlock()
	out := make(chan struct{})
	go func() {
		io.Copy(ptmx, s.ch) //nolint:errcheck // either end may go away
	}()
	go func() {
		defer close(out)
		io.Copy(s.ch, ptmx) //nolint:errcheck // EIO once every replica is closed
	}()
	go func() {
		cmd.Wait() //nolint:errcheck // exit reports the status
		// The output the command left in the pty, unless a background
		// child still holds it open.
		select {
		case <-out:
		case <-time.After(time.Second):
		}
		s.mu.Lock()
		s.ptmx = nil
		s.mu.Unlock()
		ptmx.Close()
		s.exit(cmd)
	}()
	return nil
}

// exit reports how the command ended and closes the channel.
func (s *session) exit(cmd *exec.Cmd) {
	ps := cmd.ProcessState
	var st syscall.WaitStatus
	if ps != nil {
		st, _ = ps.Sys().(syscall.WaitStatus)
	}
	switch {
	case ps == nil:
		s.ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{255})) //nolint:errcheck // the client may be gone
	case st.Signaled():
		s.ch.SendRequest("exit-signal", false, ssh.Marshal(struct { //nolint:errcheck // the client may be gone
			Signal     string
			CoreDumped bool
			Msg, Lang  string
		}{Signal: signalName(st.Signal()), CoreDumped: st.CoreDump()}))
	default:
		s.ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{uint32(ps.ExitCode())})) //nolint:errcheck // the client may be gone
	}
	s.ch.CloseWrite() //nolint:errcheck // the client may be gone
	s.ch.Close()
}

// directTCPIP joins a direct-tcpip channel (ssh -L) to a connection made
// from inside the sandbox.
func directTCPIP(nc ssh.NewChannel) {
	var p struct {
		Host       string
		Port       uint32
		OriginHost string
		OriginPort uint32
	}
	if err := ssh.Unmarshal(nc.ExtraData(), &p); err != nil || p.Port > 65535 {
		nc.Reject(ssh.ConnectionFailed, "bad direct-tcpip request")
		return
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort(p.Host, strconv.Itoa(int(p.Port))), 10*time.Second)
	if err != nil {
		nc.Reject(ssh.ConnectionFailed, err.Error())
		return
	}
	ch, reqs, err := nc.Accept()
	if err != nil {
		c.Close()
		return
	}
	go ssh.DiscardRequests(reqs)
	wire.Join(c.(*net.TCPConn), channelStream{ch})
	ch.Close()
}

// channelStream is a channel whose Close is a half close, as wire.Join
// wants; the full close follows when both directions are done.
type channelStream struct{ ssh.Channel }

func (c channelStream) Close() error {
	c.Channel.CloseWrite() //nolint:errcheck // the client may be gone
	return nil
}

// sftpMain is "sftp-server": an SFTP server on stdin/stdout, as the
// user that runs it, in its working directory.
func sftpMain(args []string) int {
	if len(args) != 0 {
		return usage("sftp-server")
	}
	wd, _ := os.Getwd()
	srv, err := sftp.NewServer(stdio{}, sftp.WithServerWorkingDirectory(wd))
	if err != nil {
		return fail(err)
	}
	if err := srv.Serve(); err != nil && !errors.Is(err, io.EOF) {
		return fail(err)
	}
	return 0
}
