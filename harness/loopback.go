package harness

import (
	"net"
	"sync"
	"testing"
)

// ServeLoopback listens on a free 127.0.0.1 port and runs serve, in a
// goroutine of its own, on every connection it accepts, until t.Cleanup
// closes the listener and the connections and waits for every serve to
// return. It returns the address. A fake server is built on it.
func ServeLoopback(tb testing.TB, serve func(net.Conn)) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		open []net.Conn
	)
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			wg.Go(func() { serve(c) })
		}
	})
	tb.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		for _, c := range open {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().String()
}
