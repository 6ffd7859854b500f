package harness

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy on a free 127.0.0.1 port that forwards every
// connection to a target server and injects the network faults a process
// signal cannot: latency on the replies, connections cut in the middle of a
// reply, and a blackhole that accepts and never answers. A store under test
// is pointed at Addr instead of the server. It starts in pass-through; each
// fault applies to the connections already open and to new ones until Heal.
// Its methods are safe for concurrent use.
type Proxy struct {
	// Addr is "127.0.0.1:port", where clients connect.
	Addr   string
	target string
	ln     net.Listener
	done   chan struct{} // closed by Close
	wg     sync.WaitGroup

	// mu guards the fields below it.
	mu      sync.Mutex
	fault   proxyFault
	latency time.Duration
	healed  chan struct{}         // closed when a blackhole ends; replaced by Blackhole
	conns   map[net.Conn]struct{} // every socket, both sides, for Close
	clients int                   // client connections open
	cuts    int
}

// proxyFault is the fault a Proxy injects.
type proxyFault uint8

const (
	proxyPass      proxyFault = iota // forward as it comes
	proxyDrop                        // cut each connection in the middle of its next reply
	proxyBlackhole                   // hold everything, answer nothing
)

// StartProxy starts a Proxy to target for the test and closes it in
// t.Cleanup.
func StartProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	p, err := LaunchProxy(target)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	return p
}

// LaunchProxy starts a Proxy to target, for programs without a testing.TB
// (the soak runner). The caller must call Close. The target need not be up:
// a connection it refuses is closed at once, as the server's own port would.
func LaunchProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("harness: proxy: %w", err)
	}
	p := &Proxy{
		Addr:   ln.Addr().String(),
		target: target,
		ln:     ln,
		done:   make(chan struct{}),
		healed: make(chan struct{}),
		conns:  map[net.Conn]struct{}{},
	}
	close(p.healed)
	p.wg.Go(p.accept)
	return p, nil
}

// SetLatency delays every chunk of a reply by d from when the proxy read it
// (0: none). Chunks of one connection keep their order, so a reply that
// follows another within d waits for it: a pipelined client sees its
// round trip grow by d.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
}

// DropReplies makes the proxy cut every connection, open or new, in the
// middle of the next reply it carries: half of the chunk read from the
// target is forwarded, then both sides are closed. The command has run on
// the server; the client gets a truncated reply and then EOF.
func (p *Proxy) DropReplies() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fault = proxyDrop
}

// Blackhole makes the proxy stop forwarding, in both directions, on every
// connection, and accept new connections without connecting them to the
// target, as a network partition looks from the client: writes are
// accepted until the buffers fill, and nothing is answered. Heal lets the
// held data through, as TCP delivers what it retransmitted once the network
// returns.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fault == proxyBlackhole {
		return
	}
	p.fault = proxyBlackhole
	p.healed = make(chan struct{})
}

// Heal ends every fault: latency 0, no drops, the blackhole lifted.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fault == proxyBlackhole {
		close(p.healed)
	}
	p.fault, p.latency = proxyPass, 0
}

// Conns returns the number of client connections open through the proxy,
// held ones included.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.clients
}

// Cuts returns how many connections DropReplies has cut so far.
func (p *Proxy) Cuts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

// Close stops listening, closes every connection and waits for the proxy's
// goroutines. It is safe to call more than once.
func (p *Proxy) Close() error {
	p.mu.Lock()
	select {
	case <-p.done:
		p.mu.Unlock()
		return nil
	default:
	}
	close(p.done)
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

// state returns the fault in force, the latency, and the channel a
// blackholed connection waits on.
func (p *Proxy) state() (proxyFault, time.Duration, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fault, p.latency, p.healed
}

// track records c as open, or refuses it once the proxy is closing, so
// that Close finds and closes every connection.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		return false
	default:
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A transient accept error (out of files): retry after a
			// moment rather than spin, until Close.
			select {
			case <-p.done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		if !p.track(c) {
			_ = c.Close()
			return
		}
		p.mu.Lock()
		p.clients++
		p.mu.Unlock()
		p.wg.Go(func() { p.serve(c) })
	}
}

// serve connects client c to the target, once no blackhole holds it, and
// forwards both ways until either side closes or the proxy does.
func (p *Proxy) serve(c net.Conn) {
	defer func() {
		_ = c.Close()
		p.untrack(c)
		p.mu.Lock()
		p.clients--
		p.mu.Unlock()
	}()
	if !p.pass() {
		return
	}
	s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return // the target is down: the client sees its connection closed
	}
	if !p.track(s) {
		_ = s.Close()
		return
	}
	defer p.untrack(s)
	defer s.Close()
	var once sync.Once
	cut := func() {
		once.Do(func() {
			_ = c.Close()
			_ = s.Close()
		})
	}
	var wg sync.WaitGroup
	wg.Go(func() { defer cut(); p.pump(s, c, false) })
	wg.Go(func() { defer cut(); p.pump(c, s, true) })
	wg.Wait()
}

// pass waits while a blackhole is in force, and reports false once the
// proxy is closing.
func (p *Proxy) pass() bool {
	for {
		fault, _, healed := p.state()
		if fault != proxyBlackhole {
			return true
		}
		select {
		case <-healed:
		case <-p.done:
			return false
		}
	}
}

// pump copies from src to dst chunk by chunk, applying the fault in force
// to each chunk; replies says src is the target. It returns when either
// side fails or a drop cuts the connection.
func (p *Proxy) pump(dst, src net.Conn, replies bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			read := time.Now()
			if !p.pass() {
				return
			}
			fault, latency, _ := p.state()
			if replies && latency > 0 {
				select {
				case <-time.After(time.Until(read.Add(latency))):
				case <-p.done:
					return
				}
			}
			if replies && fault == proxyDrop {
				_, _ = dst.Write(buf[:n/2])
				p.mu.Lock()
				p.cuts++
				p.mu.Unlock()
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			// EOF or a failure: serve closes both sides. The stores'
			// protocols never half-close a connection.
			return
		}
	}
}
