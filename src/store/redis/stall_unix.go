//go:build unix

package redis

import "syscall"

// heard reports whether the kernel holds something of the server's that
// this process has not read: bytes, the end of the stream, or an error
// (which the next read returns). It looks without reading (MSG_PEEK; the
// socket is non-blocking, as Go keeps every socket). A socket it cannot
// look into counts as heard: the bound is then REDIS_TIMEOUT alone.
func heard(raw syscall.RawConn) bool {
	var buf [1]byte
	var err error
	if cerr := raw.Control(func(fd uintptr) {
		for range 10 { // EINTR, bounded
			if _, _, err = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK); err != syscall.EINTR {
				return
			}
		}
	}); cerr != nil {
		return true
	}
	return err != syscall.EAGAIN && err != syscall.EWOULDBLOCK
}
