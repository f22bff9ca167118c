package runsc

import (
	"context"
	"errors"
	"fmt"
	"os"

	"gvisor.dev/gvisor/pkg/urpc"
)

// ctlPortForward is runsc's port forward under the name
// tools/runsc/portforward.patch adds: a sentry that has it forwards with
// --network=none too, passes a half close on, and writes all it reads.
const ctlPortForward = "containerManager.PortForwardHalfClose"

// ErrNoPortForward is a sandbox whose runsc cannot forward a port itself
// (a runsc without tools/runsc/portforward.patch).
var ErrNoPortForward = errors.New("the sandbox's runsc does not forward ports")

// ctlPortForwardArgs is boot.PortForwardOpts: one end of a socket pair,
// the container, its port.
type ctlPortForwardArgs struct {
	urpc.FilePayload
	ContainerID string
	Port        uint16
}

// ControlSocket is the path of the control socket of container id's
// sandbox.
func (r *Runsc) ControlSocket(id string) (string, error) {
	st, err := r.loadCtlState(id)
	if err != nil {
		return "", fmt.Errorf("sandbox %s: no control socket: %w", id, err)
	}
	return st.Sandbox.ControlSocketPath, nil
}

// PortForward hands conn, one end of a stream socket pair, to the kernel
// of the sandbox behind ctl, which joins it to a new TCP
// connection to port on the sandbox's 127.0.0.1 and copies between the
// two in the sentry: no process of the sandbox relays it. It returns once
// the connection is made; an error names why it was not (nothing
// listens: connection refused).
// It gives up when ctx ends: a server that does not accept leaves the
// connection waiting.
func PortForward(ctx context.Context, ctl *Control, id string, port uint16, conn *os.File) error {
	return portForward(ctx, ctl, ctlPortForward, id, port, conn)
}

// ctlPortForwardSocket is the port forward tools/runsc/portforward.patch
// adds for a connected host stream socket of any family: the sentry reads
// and writes the client's own connection, and the host copies nothing.
const ctlPortForwardSocket = "containerManager.PortForwardSocket"

// PortForwardSocket is PortForward with conn a connected stream socket of
// any family: a TCP connection accepted on the host is handed to the
// sentry as it is, and the caller may close its own copy once this
// returns. A runsc that cannot take one reports ErrNoPortForward, having
// done nothing with conn.
func PortForwardSocket(ctx context.Context, ctl *Control, id string, port uint16, conn *os.File) error {
	return portForward(ctx, ctl, ctlPortForwardSocket, id, port, conn)
}

// portForward makes one port forward call, method, on ctl: a sentry
// that does not know it is ErrNoPortForward.
func portForward(ctx context.Context, ctl *Control, method, id string, port uint16, conn *os.File) error {
	err := ctl.call(ctx, method, &ctlPortForwardArgs{FilePayload: urpc.FilePayload{Files: []*os.File{conn}}, ContainerID: id, Port: port}, nil)
	var re urpc.RemoteError
	if errors.As(err, &re) && re.Message == urpc.ErrUnknownMethod.Error() {
		return ErrNoPortForward
	}
	return err
}
