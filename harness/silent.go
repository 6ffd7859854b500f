package harness

import (
	"net"
	"sync"
	"testing"
)

// SilentServer listens on a free loopback port, accepts every connection
// and never reads or answers on it: a peer that is up but stalled, which a
// client waits on until its own timeout. It returns the address; the
// listener and the connections close when the test ends.
func SilentServer(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	tb.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return l.Addr().String()
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
