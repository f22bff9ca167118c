package mcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"hutch.dev/hutch/engine"
	hutchmcp "hutch.dev/hutch/mcp"
)

// The HTTP transport runs code in sandboxes and writes under
// --allow-host-dir as the user who started it, for whoever reaches it, so
// it never listens without a credential. On a UNIX socket the kernel
// tells who connected: the socket is 0600 in a directory no other user
// can write to, and each connection's peer (SO_PEERCRED) must be the
// owner or root. On loopback TCP, which every local user reaches, each
// request must carry the bearer token (token), and name this host by a
// loopback name and the port in its Host header, so that a web page whose
// name rebinds to 127.0.0.1 is refused.

// socketFile is the default socket, in the server's state directory.
const socketFile = "mcp.sock"

// listenAddr is --listen: a loopback TCP address, or a UNIX socket.
type listenAddr struct {
	tcp string
	// unix: a UNIX socket at socket ("": the default).
	unix   bool
	socket string
}

// parseListen parses --listen: HOST:PORT on loopback, "unix" or
// "unix:PATH".
func parseListen(s string) (listenAddr, error) {
	if s == "unix" {
		return listenAddr{unix: true}, nil
	}
	if p, ok := strings.CutPrefix(s, "unix:"); ok {
		if p == "" || strings.HasSuffix(p, "/") {
			return listenAddr{}, fmt.Errorf("--listen %q: want unix:PATH, the path of the socket to make", s)
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			return listenAddr{}, fmt.Errorf("--listen %q: %w", s, err)
		}
		return listenAddr{unix: true, socket: abs}, nil
	}
	if err := checkLoopback(s); err != nil {
		return listenAddr{}, err
	}
	return listenAddr{tcp: s}, nil
}

// checkLoopback refuses a TCP listen address off loopback: its tools run
// code, and a token is no reason to offer them to the network.
func checkLoopback(listen string) error {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("--listen %q: want HOST:PORT on loopback, unix or unix:PATH: %w", listen, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("--listen %q: the MCP endpoint listens on loopback only (127.0.0.1, [::1], localhost), or on a UNIX socket (unix:PATH)", listen)
	}
	return nil
}

// serveHTTP serves srv's streamable HTTP at /mcp on la until ctx ends.
// stateDir holds the token and the default socket.
func serveHTTP(ctx context.Context, srv *hutchmcp.Server, la listenAddr, stateDir string, log *slog.Logger) error {
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv.MCP() }, &sdk.StreamableHTTPOptions{
		Logger:         log,
		SessionTimeout: time.Hour,
	})
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)
	hs := &http.Server{ReadHeaderTimeout: 30 * time.Second}
	var l net.Listener
	if la.unix {
		path := la.socket
		if path == "" {
			path = filepath.Join(stateDir, socketFile)
		}
		ul, err := engine.ListenOwnerSocket(path)
		if err != nil {
			return fmt.Errorf("--listen unix:%s: %w", path, err)
		}
		l = ul
		hs.ConnContext = peerContext
		hs.Handler = ownerOnly(mux, log)
		log.Info("listening", "socket", ul.Addr().String(), "url", "http://localhost/mcp", "who", "this user and root")
	} else {
		tok, err := loadToken(stateDir)
		if err != nil {
			return err
		}
		tl, err := net.Listen("tcp", la.tcp)
		if err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		l = tl
		port := tl.Addr().(*net.TCPAddr).Port
		hs.Handler = hostCheck(port, tok.require(mux))
		log.Info("listening", "url", "http://"+tl.Addr().String()+"/mcp",
			"authorization", "Bearer "+tok.value, "token_file", tok.file)
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(l) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// hostCheck refuses, 403, a request whose Host header is not this
// server's port by a loopback name: a page of another site that rebinds
// its name to 127.0.0.1 sends its own name.
func hostCheck(port int, h http.Handler) http.Handler {
	ok := map[string]bool{}
	for _, name := range []string{"localhost", "127.0.0.1", "[::1]"} {
		ok[name+":"+strconv.Itoa(port)] = true
		if port == 80 {
			ok[name] = true
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !ok[strings.ToLower(r.Host)] {
			http.Error(w, fmt.Sprintf("Host %q: this server answers only to localhost:%d, 127.0.0.1:%d and [::1]:%d", r.Host, port, port, port), http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

type peerKey struct{}

// peer is who connected to the UNIX socket.
type peer struct {
	uid uint32
	err error
}

// peerContext records the peer of a connection accepted on the socket.
func peerContext(ctx context.Context, c net.Conn) context.Context {
	p := peer{err: fmt.Errorf("not a UNIX socket connection")}
	if uc, ok := c.(*net.UnixConn); ok {
		p.uid, p.err = engine.SocketPeerUID(uc)
	}
	return context.WithValue(ctx, peerKey{}, p)
}

// ownerOnly refuses, 403, a request on the socket from any user but the
// server's and root, whatever the socket's mode has become.
func ownerOnly(h http.Handler, log *slog.Logger) http.Handler {
	me := uint32(os.Geteuid())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := r.Context().Value(peerKey{}).(peer)
		switch {
		case !ok || p.err != nil:
			http.Error(w, fmt.Sprintf("cannot tell who is connected: %v", p.err), http.StatusForbidden)
			return
		case p.uid != me && p.uid != 0:
			log.Warn("refused a connection of another user", "uid", p.uid)
			http.Error(w, fmt.Sprintf("uid %d may not use this server: only its owner (uid %d) and root may", p.uid, me), http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}
