package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/harness"
)

// The store faults are driven against the built binary under a steady load
// of faultClients clients, each sending one request after another (every
// faultPace at most), for a bounded time. faultBudget is the service's
// budget per request (REQUEST_TIMEOUT); a client gives each call
// faultDeadline, far more, so that an answer late for its budget shows as
// late rather than as the client's own timeout.
const (
	faultClients  = 8
	faultPace     = 10 * time.Millisecond
	faultBudget   = 300 * time.Millisecond
	faultDeadline = 2 * time.Second
	// faultMargin is what an answer may take beyond faultBudget: the
	// -race binary on a loaded 2-core machine takes time to be scheduled,
	// answer and be read. Measured: 5-20 ms past the budget, 95 ms once
	// with a load average of 6.
	faultMargin = 250 * time.Millisecond
	// faultSteady is how long the load runs before the fault, faultHold
	// how long the fault lasts, and faultAfter how long the load runs
	// after the store's return: longer than the recovery bound.
	faultSteady = 500 * time.Millisecond
	faultHold   = 2 * time.Second
	faultAfter  = outageRecover + 500*time.Millisecond
	// faultMaxCalls bounds each client's calls, whatever the timing.
	faultMaxCalls = 2000
	// faultPool is REDIS_POOL_SIZE: the workers, and so the connections,
	// per Redis server.
	faultPool = 4
	// faultStoreTimeout is REDIS_TIMEOUT for a single Redis, direct or
	// behind the proxy: a Redis that does not answer is known to fail,
	// and its breaker opens, once its round trips pass it (a request's
	// own budget says nothing of Redis), within the fault's hold; and far
	// above what a healthy Redis takes, pipelined replies behind the
	// proxy's latency included.
	faultStoreTimeout = time.Second
)

// faultRules limit nothing the load reaches: every answer from the store
// is OK, so that any other answer is the fault's.
const faultRules = `domain: faults
descriptors:
  - key: fw
    rate_limit: {unit: hour, requests_per_unit: 1000000}
  - key: sw
    rate_limit: {unit: hour, requests_per_unit: 1000000, algorithm: sliding_window}
  - key: sl
    rate_limit: {unit: hour, requests_per_unit: 10000, algorithm: sliding_log}
  - key: tb
    rate_limit: {unit: hour, requests_per_unit: 1000000, algorithm: token_bucket}
`

// faultKeys are the rules' keys: client i uses faultKeys[i%4].
var faultKeys = []string{"fw", "sw", "sl", "tb"}

// answer is one call of the load.
type answer struct {
	began, ended time.Time
	code         codes.Code
	msg          string
}

func (a answer) took() time.Duration { return a.ended.Sub(a.began) }

// load is faultClients clients sending a steady stream of requests until
// stop (or faultMaxCalls each).
type load struct {
	answers [][]answer
	done    chan struct{}
	wg      sync.WaitGroup
}

// startLoad starts one client per client of cs, client i sending its
// request for values[i].
func startLoad(cs []rlsv3.RateLimitServiceClient, values []string) *load {
	l := &load{answers: make([][]answer, len(cs)), done: make(chan struct{})}
	for i, c := range cs {
		req := request("faults", faultKeys[i%len(faultKeys)], values[i])
		l.wg.Go(func() {
			for range faultMaxCalls {
				select {
				case <-l.done:
					return
				default:
				}
				a := answer{began: time.Now()}
				ctx, cancel := context.WithTimeout(context.Background(), faultDeadline)
				resp, err := c.ShouldRateLimit(ctx, req)
				cancel()
				a.ended, a.code = time.Now(), status.Code(err)
				if err != nil {
					a.msg = status.Convert(err).Message()
				} else if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					// No limit is reached: a refusal is a wrong answer.
					a.code, a.msg = codes.Unknown, "answered "+resp.GetOverallCode().String()
				}
				l.answers[i] = append(l.answers[i], a)
				select {
				case <-l.done:
					return
				case <-time.After(time.Until(a.began.Add(faultPace))):
				}
			}
		})
	}
	return l
}

// stop ends the load and returns every client's answers.
func (l *load) stop() [][]answer {
	close(l.done)
	l.wg.Wait()
	return l.answers
}

// goroutineCount returns the service's goroutine count, from the debug
// listener's goroutine profile.
func (p *proc) goroutineCount() (int, error) {
	resp, err := http.Get("http://" + p.debug + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	n, err := strconv.Atoi(strings.TrimPrefix(first, "goroutine profile: total "))
	if err != nil {
		return 0, fmt.Errorf("goroutine profile starts with %q", first)
	}
	return n, nil
}

// redisClients counts the client connections of a Redis from its own view
// (CLIENT LIST): those of the service, less the one that asks, the
// sentinels' (named sentinel-...) and replication links (flags S or M).
func redisClients(r *harness.RedisServer) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := r.Do(ctx, "CLIENT", "LIST")
	if err != nil {
		return 0, err
	}
	s, _ := v.(string)
	n := -1
	for line := range strings.Lines(s) {
		f := " " + strings.TrimSpace(line) + " "
		if !strings.Contains(f, " name=sentinel-") && !strings.Contains(f, " flags=S ") && !strings.Contains(f, " flags=M ") {
			n++
		}
	}
	return n, nil
}

// memcachedClients counts memcached's client connections (curr_connections),
// less the one that asks.
func memcachedClients(m *harness.MemcachedServer) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := m.Stats(ctx)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(st["curr_connections"])
	return n - 1, err
}

// fault is one way for the store to fail, and what the test needs to know
// about it.
type fault struct {
	// env points the service at the store.
	env []string
	// inject starts the fault; fix ends it and returns once the store
	// answers again (the instant recovery is measured from).
	inject, fix func() error
	// returned, when set, tells when the store returned, if that was
	// before fix returned (a failover that completed within faultHold).
	returned func() time.Time
	// storeConns counts the service's connections from the store's side.
	storeConns func() (int, error)
	// values are the clients' descriptor values (nil: "c0", "c1", ...).
	values []string
	// spared reports the clients that the fault must not touch at all
	// (on a Cluster, those whose keys live on the masters still up).
	spared func(i int) bool
	// noErrors says the fault must not cause errors at all (latency
	// within the budget, or STORE_FAILURE_MODE=local).
	noErrors bool
	// servers is the number of store servers the service connects to
	// (0: one).
	servers int
	// hold replaces faultHold.
	hold time.Duration
}

// pool is the most store connections the load may open: faultPool per
// server.
func (f fault) pool() int { return faultPool * max(f.servers, 1) }

// usage is what the service holds: its goroutines, its open files, and its
// connections as the store counts them.
type usage struct{ goroutines, files, conns int }

func (u usage) String() string {
	return fmt.Sprintf("%d goroutines, %d open files, %d store connections", u.goroutines, u.files, u.conns)
}

// usage reads the service's usage; errors are returned, not fatal, so that
// a sampling goroutine may call it.
func (p *proc) usage(f fault) (usage, error) {
	var u usage
	var err error
	if u.goroutines, err = p.goroutineCount(); err != nil {
		return u, err
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.cmd.Process.Pid))
	if err != nil {
		return u, err
	}
	u.files = len(fds)
	u.conns, err = f.storeConns()
	return u, err
}

// testFault serves with f.env, runs the load, injects the fault for
// faultHold, fixes it, and checks the service's behaviour throughout: no
// panic or race; errors only from the fault's start to outageRecover after
// the store's return (none at all with f.noErrors, none for f.spared
// clients); once the breaker has opened, no request waiting for its
// budget until the store's return; every answer within faultBudget +
// faultMargin; every client decided again within outageRecover of the
// store's return; and no leak: afterwards, the goroutines, open files and
// store connections of before.
func testFault(t *testing.T, f fault) {
	harness.LockLoad(t)
	env := append([]string{"REQUEST_TIMEOUT=" + faultBudget.String(), "REDIS_POOL_SIZE=" + strconv.Itoa(faultPool)}, f.env...)
	p := start(t, map[string]string{"faults.yaml": faultRules}, env...)
	cs := make([]rlsv3.RateLimitServiceClient, faultClients)
	for i := range cs {
		cs[i] = p.client(t)
	}
	values := f.values
	if values == nil {
		for i := range faultClients {
			values = append(values, fmt.Sprint("c", i))
		}
	}

	// A first load opens the connections (gRPC and the store's), so that
	// the usage before and after compare like with like.
	warm := watchStalls()
	warmed := startLoad(cs, values).stopAfter(500 * time.Millisecond)
	warm.stop()
	for _, as := range warmed {
		for _, a := range as {
			if a.code != codes.OK && !(a.code == codes.DeadlineExceeded && warm.stalledDuring(a)) {
				t.Fatalf("before the fault: %v %s", a.code, a.msg)
			}
		}
	}
	before, err := p.usage(f)
	if err != nil {
		t.Fatal(err)
	}

	l := startLoad(cs, values)
	stalls := watchStalls()
	// Sample the usage while the load runs, for its peak.
	var peak usage
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if u, err := p.usage(f); err == nil {
				peak = usage{max(peak.goroutines, u.goroutines), max(peak.files, u.files), max(peak.conns, u.conns)}
			}
			select {
			case <-l.done:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	time.Sleep(faultSteady)
	injected := time.Now()
	if err := f.inject(); err != nil {
		l.stop()
		t.Fatal(err)
	}
	hold := faultHold
	if f.hold > 0 {
		hold = f.hold
	}
	time.Sleep(time.Until(injected.Add(hold)))
	if err := f.fix(); err != nil {
		l.stop()
		t.Fatal(err)
	}
	fixed := time.Now()
	if f.returned != nil {
		fixed = f.returned()
	}
	time.Sleep(faultAfter)
	answers := l.stop()
	<-sampled
	// The machine's own stalls stretch every time bound: a busy host that
	// stops this process for a second stops the service's too.
	stall := stalls.stop()

	if logs := p.logs(); strings.Contains(logs, "panic:") || strings.Contains(logs, "DATA RACE") || strings.Contains(logs, "fatal error:") {
		t.Errorf("the service panicked or raced:\n%s", logs)
	}

	// Once the breaker has refused a request, it stays open until the
	// store returns: no request sent after that waits for its budget.
	var opened time.Time
	for _, as := range answers {
		for _, a := range as {
			if strings.Contains(a.msg, "circuit breaker open") && (opened.IsZero() || a.ended.Before(opened)) {
				opened = a.ended
			}
		}
	}

	calls, failed, byCode := 0, 0, map[codes.Code]int{}
	var slowest answer
	var firstOK, allOK time.Time
	for i, as := range answers {
		var lastErr time.Time
		for _, a := range as {
			calls++
			byCode[a.code]++
			if a.took() > slowest.took() {
				slowest = a
			}
			if a.code != codes.OK {
				failed++
				lastErr = a.ended
				switch {
				case f.noErrors:
					t.Errorf("client %d: %v %q at %v: want no error from this fault", i, a.code, a.msg, a.began.Sub(injected))
				case f.spared != nil && f.spared(i):
					t.Errorf("client %d (spared): %v %q at %v: want no error for keys the fault does not touch", i, a.code, a.msg, a.began.Sub(injected))
				case (a.ended.Before(injected) || a.began.After(fixed.Add(outageRecover+stall))) &&
					!(a.code == codes.DeadlineExceeded && stalls.stalledDuring(a)):
					// Errors only while the fault lasts: a call that
					// ended before it, or began after the recovery
					// bound, must be decided, unless the machine
					// stopped while it ran and its budget passed.
					t.Errorf("client %d: %v %q, call began %v after the fault began and %v after the store's return: outside the fault",
						i, a.code, a.msg, a.began.Sub(injected), a.began.Sub(fixed))
				}
			}
			if a.code == codes.DeadlineExceeded && !opened.IsZero() && a.began.After(opened) && a.ended.Before(fixed) {
				t.Errorf("client %d: %v after %v, sent %v after the breaker opened: it closed while the store could not serve",
					i, a.code, a.took(), a.began.Sub(opened))
			}
			if took := a.took(); took > faultBudget+faultMargin+stall {
				t.Errorf("client %d: %v answered after %v (began %v after the fault began): over the %v budget + %v + the machine's longest stall, %v",
					i, a.code, took, a.began.Sub(injected), faultBudget, faultMargin, stall)
			}
		}
		// The first decision after the fix, over all clients; and for
		// each client, the first after its last error.
		for _, a := range as {
			if a.code == codes.OK && a.ended.After(fixed) {
				if firstOK.IsZero() || a.ended.Before(firstOK) {
					firstOK = a.ended
				}
				break
			}
		}
		for _, a := range as {
			if a.code == codes.OK && a.ended.After(fixed) && a.ended.After(lastErr) {
				if a.ended.After(allOK) {
					allOK = a.ended
				}
				break
			}
		}
	}
	if firstOK.IsZero() {
		t.Fatalf("no decision after the store's return (%d calls, %v)", calls, byCode)
	}
	if !f.noErrors && failed == 0 {
		t.Errorf("no error in %d calls: the fault did not reach the service", calls)
	}
	if d := allOK.Sub(fixed); d > outageRecover+stall {
		t.Errorf("every client decided again %v after the store's return, want within %v + the machine's longest stall, %v", d, outageRecover, stall)
	}

	// No leak: once the load has stopped, the service is back to what it
	// held before the fault, within a small tolerance: the runtime's and
	// gRPC's own goroutines come and go, and the store's connections are
	// reopened as the load needs them, up to faultPool per server, plus
	// the probes' (the pool keeps as many idle as were busy at once, so
	// the files are compared without them).
	var after usage
	harness.WaitForNil(t, 10*time.Second, "back to the usage before the fault", func() error {
		var err error
		if after, err = p.usage(f); err == nil && after.goroutines <= before.goroutines+4 &&
			after.files-after.conns <= before.files-before.conns+4 && after.conns <= max(before.conns, f.pool())+2 {
			return nil
		}
		return fmt.Errorf("%v (%v); before the fault: %v", after, err, before)
	})
	t.Logf("%d calls: %v; slowest answer %v (%v, began %v after the fault began), budget %v, longest stall of the machine %v; "+
		"first decision %v after the store's return, every client %v; before %v, peak %v, after %v",
		calls, byCode, slowest.took().Round(time.Millisecond), slowest.code, slowest.began.Sub(injected).Round(time.Millisecond), faultBudget, stall.Round(time.Millisecond),
		max(firstOK.Sub(fixed), 0).Round(time.Millisecond), max(allOK.Sub(fixed), 0).Round(time.Millisecond),
		before, peak, after)
}

// stallWatch measures how late this process is woken: a goroutine that
// asks to sleep stallTick at a time and records the longest oversleep. On a
// busy 2-core host every process is stopped now and then, the service as
// much as the test; the tests add the longest stall seen to their time
// bounds, so that a bound is the service's, not the machine's.
type stallWatch struct {
	done    chan struct{}
	stopped chan struct{}
	// stalls are the oversleeps past stallSeen, each as the interval it
	// covered; worst is the longest. Written by the watch's goroutine
	// until stopped is closed.
	stalls []stall
	worst  time.Duration
}

type stall struct{ from, to time.Time }

const (
	stallTick = 5 * time.Millisecond
	// stallSeen is the oversleep worth remembering as a stall.
	stallSeen = 50 * time.Millisecond
)

func watchStalls() *stallWatch {
	w := &stallWatch{done: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(w.stopped)
		for {
			before := time.Now()
			select {
			case <-w.done:
				return
			case <-time.After(stallTick):
			}
			now := time.Now()
			late := now.Sub(before) - stallTick
			w.worst = max(w.worst, late)
			if late >= stallSeen {
				w.stalls = append(w.stalls, stall{from: before, to: now})
			}
		}
	}()
	return w
}

// stop ends the watch and returns the longest stall seen.
func (w *stallWatch) stop() time.Duration {
	close(w.done)
	<-w.stopped
	return w.worst
}

// stalledDuring reports whether the machine stalled (by stallSeen or
// more) while a call ran; call it after stop.
func (w *stallWatch) stalledDuring(a answer) bool {
	for _, s := range w.stalls {
		if s.from.Before(a.ended) && s.to.After(a.began) {
			return true
		}
	}
	return false
}

// stopAfter lets the load run for d, then stops it.
func (l *load) stopAfter(d time.Duration) [][]answer {
	time.Sleep(d)
	return l.stop()
}

// TestFaultsUnderLoad injects each store fault into a service under load:
// Redis killed and restarted, frozen and thawed, the network to it slow,
// cutting replies, or a blackhole; memcached killed and restarted; a
// Sentinel failover; one Cluster master down. See testFault for what is
// checked; docs/RELIABILITY.md records the figures.
func TestFaultsUnderLoad(t *testing.T) {
	slow(t)
	redisFault := func(t *testing.T, inject, fix func(r *harness.RedisServer) error) fault {
		r := harness.StartRedis(t, harness.RedisOptions{})
		t.Cleanup(func() { _ = r.Thaw() })
		return fault{
			env:        redisEnv(r, "REDIS_TIMEOUT="+faultStoreTimeout.String()),
			inject:     func() error { return inject(r) },
			fix:        func() error { return fix(r) },
			storeConns: func() (int, error) { return redisClients(r) },
		}
	}
	proxyFault := func(t *testing.T, inject func(*harness.Proxy)) fault {
		r := harness.StartRedis(t, harness.RedisOptions{})
		px := harness.StartProxy(t, r.Addr)
		return fault{
			env:    []string{"BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + px.Addr, "REDIS_TIMEOUT=" + faultStoreTimeout.String()},
			inject: func() error { inject(px); return nil },
			fix:    func() error { px.Heal(); return nil },
			storeConns: func() (int, error) {
				n, err := redisClients(r)
				return max(n, px.Conns()), err
			},
		}
	}
	tests := []struct {
		name  string
		fault func(t *testing.T) fault
	}{
		{"redis_killed", func(t *testing.T) fault {
			return redisFault(t, (*harness.RedisServer).Stop, (*harness.RedisServer).Start)
		}},
		{"redis_frozen", func(t *testing.T) fault {
			return redisFault(t, (*harness.RedisServer).Freeze, (*harness.RedisServer).Thaw)
		}},
		{"proxy_latency_within_budget", func(t *testing.T) fault {
			f := proxyFault(t, func(px *harness.Proxy) { px.SetLatency(faultBudget / 5) })
			f.noErrors = true
			return f
		}},
		{"proxy_latency_over_budget", func(t *testing.T) fault {
			f := proxyFault(t, func(px *harness.Proxy) { px.SetLatency(4 * faultBudget) })
			// Longer than a probe (500 ms) and its late answer (1.2 s):
			// the breaker must not close on it.
			f.hold = 3500 * time.Millisecond
			return f
		}},
		{"proxy_drops_replies", func(t *testing.T) fault {
			return proxyFault(t, (*harness.Proxy).DropReplies)
		}},
		{"proxy_blackhole", func(t *testing.T) fault {
			return proxyFault(t, (*harness.Proxy).Blackhole)
		}},
		{"memcached_killed", func(t *testing.T) fault {
			m := harness.StartMemcached(t)
			return fault{
				env:        memcacheEnv(m),
				inject:     m.Stop,
				fix:        m.Start,
				storeConns: func() (int, error) { return memcachedClients(m) },
			}
		}},
		{"sentinel_failover", func(t *testing.T) fault {
			g := harness.StartRedisSentinel(t, harness.RedisSentinelOptions{})
			// Failover swaps g.Master and g.Replica: count on both.
			data := []*harness.RedisServer{g.Master, g.Replica}
			failed := make(chan error, 1)
			var promoted time.Time
			return fault{
				env: []string{"BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=SENTINEL", "REDIS_URL=" + g.URL},
				// The master is killed; the fault lasts until the
				// sentinels have promoted the replica.
				inject: func() error {
					killed := time.Now()
					go func() {
						err := g.Failover(t.Context())
						promoted = time.Now()
						t.Logf("the sentinels promoted the replica %v after the master was killed", promoted.Sub(killed).Round(time.Millisecond))
						failed <- err
					}()
					return nil
				},
				fix:      func() error { return <-failed },
				returned: func() time.Time { return promoted }, // read after fix, which waits for it
				storeConns: func() (int, error) {
					n := 0
					for _, r := range data {
						if r.Running() {
							k, err := redisClients(r)
							if err != nil {
								return 0, err
							}
							n += k
						}
					}
					return n, nil
				},
			}
		}},
		{"redis_frozen_local_mode", func(t *testing.T) fault {
			// STORE_FAILURE_MODE=local: the same fault, and not one error.
			f := redisFault(t, (*harness.RedisServer).Freeze, (*harness.RedisServer).Thaw)
			f.env = append(f.env, "STORE_FAILURE_MODE=local")
			f.noErrors = true
			return f
		}},
		{"cluster_master_down", func(t *testing.T) fault {
			return clusterFault(t)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			testFault(t, tt.fault(t))
		})
	}
}

// clusterFault kills one master of a three-master Cluster that keeps
// serving the others' slots (cluster-require-full-coverage no, as the
// README advises), and restarts it. Clients 0, 3 and 6 use keys on the
// master that dies; the others must see no error at all.
func clusterFault(t *testing.T) fault {
	c := harness.StartRedisCluster(t, harness.RedisOptions{Config: []string{"cluster-require-full-coverage no"}})
	down := c.Masters[0]
	// Hash tags put each client's keys on a chosen master: client i on
	// master i%3.
	values := make([]string, faultClients)
	for i, k := 0, 0; i < faultClients; k++ {
		tag := fmt.Sprint("t", k)
		m, err := c.MasterFor(t.Context(), tag)
		if err != nil {
			t.Fatal(err)
		}
		if m == c.Masters[i%3] {
			values[i] = "{" + tag + "}"
			i++
		}
	}
	return fault{
		env:     []string{"BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=CLUSTER", "REDIS_URL=" + c.URL},
		values:  values,
		servers: len(c.Masters),
		spared:  func(i int) bool { return i%3 != 0 },
		inject:  down.Stop,
		fix: func() error {
			if err := down.Start(); err != nil {
				return err
			}
			// A restarted master refuses writes (CLUSTERDOWN) until
			// it has rejoined: Redis waits about 2 s before it calls its
			// own state ok. The store is back from then on.
			began := time.Now()
			for !clusterOK(down) {
				if time.Since(began) > 30*time.Second {
					return fmt.Errorf("%s: cluster_state not ok 30 s after its restart", down.Addr)
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Logf("the restarted master reported cluster_state:ok %v after it answered", time.Since(began).Round(time.Millisecond))
			return nil
		},
		storeConns: func() (int, error) {
			n := 0
			for _, m := range c.Masters {
				k, err := redisClients(m)
				if err != nil {
					return 0, err
				}
				n += k
			}
			return n, nil
		},
	}
}

// clusterOK reports whether a cluster node says cluster_state:ok.
func clusterOK(r *harness.RedisServer) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	v, err := r.Do(ctx, "CLUSTER", "INFO")
	s, _ := v.(string)
	return err == nil && strings.Contains(s, "cluster_state:ok")
}
