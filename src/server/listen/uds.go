package listen

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"syscall"
	"time"
)

// A Unix socket path (GRPC_UDS) is shared ground: another instance may be
// serving on it, or may take it over after this one. The server removes a
// path only when it is a socket nobody answers on, and at shutdown only
// the socket it created itself.

// udsProbe bounds the dial that asks whether a process answers on a
// socket found at the path.
const udsProbe = 500 * time.Millisecond

// ClearSocketPath makes path free for a new socket: nothing there, or a
// socket no process answers on (left by one that died), which it removes.
// Anything else is an error that names GRPC_UDS and leaves the path alone:
// a file that is not a socket, or a socket a running process serves.
func ClearSocketPath(path string) error {
	info, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("server: GRPC_UDS %s: %w", path, err)
	}
	if info.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("server: GRPC_UDS %s exists and is not a socket (%s); not removing it", path, info.Mode().Type())
	}
	c, err := net.DialTimeout("unix", path, udsProbe)
	if err == nil {
		c.Close()
		return fmt.Errorf("server: GRPC_UDS %s: another process serves on this socket; not taking it over", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("server: GRPC_UDS %s: cannot tell whether a process serves on it: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("server: GRPC_UDS %s: removing a stale socket: %w", path, err)
	}
	return nil
}

// OwnSocket keeps the identity of the socket this server created at path,
// so that shutdown removes that one and not one a successor made since.
// Go's listener would remove the path on Close whatever it holds: that is
// turned off.
type OwnSocket struct {
	path string
	info fs.FileInfo
}

// ClaimSocket records the socket l created at path.
func ClaimSocket(l net.Listener, path string) (*OwnSocket, error) {
	if ul, ok := l.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
	}
	info, err := os.Lstat(path)
	if err != nil {
		return nil, fmt.Errorf("server: GRPC_UDS %s: %w", path, err)
	}
	return &OwnSocket{path: path, info: info}, nil
}

// Remove removes the path if it is still the socket this server created:
// the same inode, and no process answers on it (this server's listener is
// closed by then). The second check is needed because a file system may
// give a successor's new socket the inode number of the one it replaced.
func (o *OwnSocket) Remove() {
	if o == nil {
		return
	}
	info, err := os.Lstat(o.path)
	if err != nil || !os.SameFile(info, o.info) {
		return
	}
	if c, err := net.DialTimeout("unix", o.path, udsProbe); err == nil {
		c.Close()
		return
	}
	_ = os.Remove(o.path)
}
