package harness

import (
	"net"
	"testing"
)

// SilentServer listens on a free loopback port, accepts every connection
// and never reads or answers on it: a peer that is up but stalled, which a
// client waits on until its own timeout. It returns the address; the
// listener and the connections close when the test ends.
func SilentServer(tb testing.TB) string {
	tb.Helper()
	return ServeLoopback(tb, func(net.Conn) {})
}

// ClosedPort is a loopback address nothing listens on: one the kernel gave
// a listener that is closed at once. Connections to it are refused.
func ClosedPort(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
