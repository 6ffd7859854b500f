package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/quota"
	"github.com/ratelimitd/ratelimit/src/rlqs"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/stats"
	"github.com/ratelimitd/ratelimit/src/store/redis"
)

// scenario is one run of a fleet.
type scenario struct {
	name string
	// envoys serve tenants; each tenant is one bucket id, its demand
	// skewed (Zipf) and split between the Envoys that serve it (the
	// more popular, the more Envoys), the split drawn again every
	// shiftEvery.
	envoys, tenants int
	// rate and burst are the rule every tenant has.
	rate, burst float64
	// overload is the most popular tenant's demand over the rate.
	overload float64
	// interval is Envoy's report period, ttl the service's
	// RLQS_ASSIGNMENT_TTL.
	interval, ttl time.Duration
	duration      time.Duration
	shiftEvery    time.Duration
	// reconnect is the share of Envoys whose stream breaks at each shift
	// (they keep their assignments and open a new stream at their next
	// report).
	reconnect float64
	// dt is the simulation's step.
	dt time.Duration
	// replicas, when set, is how many replicas of the service share the
	// pools through a real redis-server; Envoy i's stream goes to
	// replica i mod replicas. Zero is one replica with no Redis.
	replicas int
	// concurrent runs each tick on a goroutine of its own, as the
	// service's ticker does beside the streams' handlers, and meanwhile
	// calls the service from another, as a stream does (a Take, which
	// takes the service's lock and finds nothing to send), every
	// probeEvery until the tick is done: the longest of those calls is
	// the longest a stream waited for that tick.
	concurrent bool
	// kill, when set, is when the replica that owns the most pools is
	// killed (SIGKILL: it says nothing); its Envoys open streams to the
	// others at their next report.
	kill time.Duration
	// sample is how many tenants, the most popular, are checked, when
	// checks is set.
	sample int
	checks bool
	seed   uint64
}

// result is what a run found.
type result struct {
	buckets, subs int
	// worst is the largest admitted / bound of any window of a sampled
	// tenant; violation describes the first window over its bound.
	worst     float64
	violation string
	// fallbacks counts requests admitted after an assignment expired.
	fallbacks int
	// fairMean and fairWorst are the deviation of the admitted rates
	// from the max-min fair ones (or the demand, when less), summed over
	// a tenant's Envoys over the last 10 s of each period, as a share of
	// the rate; converge is the longest time after a shift until the
	// rates granted stayed within 10 % of the service's targets.
	fairMean, fairWorst float64
	converge            time.Duration
	// cpuReport is the service's time per bucket report (its Report and
	// Take calls over the bucket usages it handled), cpuTick per tick of
	// every pool.
	cpuReport, cpuTick time.Duration
	heapPerSub         float64
	// takeovers counts the pools a replica took over from another, late
	// the grants sent later than Settle assumes; recovered is how long
	// after a replica's death the grants stayed within 10 % of the
	// targets again (as converge), served how long until every sampled
	// tenant admitted 90 % of min(rate, demand) and each of its Envoys
	// 90 % of its max-min fair share (as fairMean's), over every 4 s
	// until the next shift (24 h: not by then).
	takeovers, late   uint64
	recovered, served time.Duration
	// waitMedian and waitMax are the median and the largest, over the
	// ticks, of the longest call beside a tick (with concurrent).
	waitMedian, waitMax time.Duration
	// redisLoad is the CPU the redis-server used per second simulated:
	// the share of a core it would take in real time.
	redisLoad float64
}

var epoch = time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)

// pair is one tenant's load on one Envoy.
type pair struct {
	e         *envoy
	tenant    int
	weight    float64
	demand    float64
	acc       float64
	perSecond []int // admitted each second, for sampled tenants
	// granted is the rate of the token bucket in force at the end of
	// each second (0 with none), for sampled tenants.
	granted []float64
	// history is the demand of each period between shifts.
	history []float64
}

func (sc scenario) rules() string {
	return fmt.Sprintf("domain: web\nquota_buckets:\n  - bucket: {name: api, tenant: \"*\"}\n    rate_limit: {unit: second, requests_per_unit: %d, burst: %d}\n",
		int(sc.rate), int(sc.burst))
}

// settle is the service's Settle: longer with replicas, whose grants
// take a tick and two round trips more to reach their Envoys.
func (sc scenario) settle() time.Duration {
	if sc.replicas > 0 {
		return rlqs.SharedSettle
	}
	return quota.DefaultSettle
}

// replica is one replica of the service in a run.
type replica struct {
	q    *rlqs.Service
	reg  *stats.Registry
	dead bool
	// offset is when in each second it ticks.
	offset time.Duration
	// probe is the session callBeside calls.
	probe *rlqs.Session
}

// redisCPU returns the CPU time srv has used, user and system (INFO cpu).
func redisCPU(srv *harness.RedisServer) time.Duration {
	v, err := srv.Do(context.Background(), "INFO", "cpu")
	info, _ := v.(string)
	if err != nil {
		return 0
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, val, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_sys" || k == "used_cpu_user" {
			f, _ := strconv.ParseFloat(val, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// replicas starts the run's replicas: one with no store, or sc.replicas
// sharing a redis-server started in dir; close stops what they use, and
// cpu reads the CPU the redis-server has used (zero without one).
func (sc scenario) startReplicas(dir string, now func() time.Time, cfg *rules.Config) (reps []*replica, closeAll func(), cpu func() time.Duration, err error) {
	qc := sc.config(now, epoch)
	var closers []func()
	closeAll = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	n := max(1, sc.replicas)
	cpu = func() time.Duration { return 0 }
	if sc.replicas > 0 {
		srv, err := harness.LaunchRedis(dir, harness.RedisOptions{})
		if err != nil {
			return nil, closeAll, cpu, err
		}
		closers = append(closers, func() { _ = srv.Close() })
		cpu = func() time.Duration { return redisCPU(srv) }
		for i := range n {
			st, err := redis.New(context.Background(), redis.Config{URL: srv.Addr})
			if err != nil {
				closeAll()
				return nil, nil, cpu, err
			}
			closers = append(closers, func() { _ = st.Close() })
			c := qc
			c.Share, c.Replica = st, uint32(i+1)
			// Replicas tick at different times of each second, on the
			// step's grid.
			offset := (time.Duration(i) * time.Second / time.Duration(n)).Truncate(sc.dt)
			r := &replica{reg: stats.NewRegistry(), offset: offset}
			r.q = rlqs.New(r.reg, c)
			r.q.SetRules(cfg)
			reps = append(reps, r)
		}
		return reps, closeAll, cpu, nil
	}
	r := &replica{reg: stats.NewRegistry()}
	r.q = rlqs.New(r.reg, qc)
	r.q.SetRules(cfg)
	return []*replica{r}, closeAll, cpu, nil
}

// config is the service's configuration for a run, started at start.
func (sc scenario) config(now func() time.Time, start time.Time) rlqs.Config {
	return rlqs.Config{
		Pool:                quota.Config{TTL: sc.ttl, ReportInterval: sc.interval, Start: start},
		MaxStreams:          sc.envoys + 1,
		MaxBuckets:          10_000_000,
		MaxBucketsPerStream: 1_000_000,
		Now:                 now,
	}
}

func (sc scenario) run() (result, error) {
	var res result
	rng := rand.New(rand.NewPCG(sc.seed, 0))
	now := epoch
	cfg, err := rules.Parse([]rules.File{{Name: "sim.yaml", Data: []byte(sc.rules())}}, rules.Options{})
	if err != nil {
		return res, err
	}
	dir, err := os.MkdirTemp("", "rlqssim")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	reps, closeReplicas, redisCPU, err := sc.startReplicas(dir, func() time.Time { return now }, cfg)
	if err != nil {
		return res, err
	}
	defer closeReplicas()
	redisBefore := redisCPU()
	envoys := make([]*envoy, sc.envoys)
	for i := range envoys {
		envoys[i] = newEnvoy(i, sc.interval, reps[i%len(reps)].q)
		envoys[i].rep = i % len(reps)
	}

	// Tenant t's demand is overload × rate × (1/(t+1))^1.1, spread over
	// k_t Envoys, between 2 and all of them in proportion to popularity.
	var pairs []*pair
	byTenant := make([][]*pair, sc.tenants)
	steps := int(sc.duration / sc.dt)
	seconds := int(sc.duration / time.Second)
	for t := range sc.tenants {
		w := math.Pow(float64(t+1), -1.1)
		k := min(sc.envoys, max(2, int(math.Round(float64(sc.envoys)*w))))
		for _, i := range rng.Perm(sc.envoys)[:k] {
			p := &pair{e: envoys[i], tenant: t}
			if t < sc.sample && sc.checks {
				p.perSecond = make([]int, seconds+1)
				p.granted = make([]float64, seconds+1)
			}
			pairs = append(pairs, p)
			byTenant[t] = append(byTenant[t], p)
		}
	}
	total := func(t int) float64 { return sc.overload * sc.rate * math.Pow(float64(t+1), -1.1) }
	shift := func() {
		for t, ps := range byTenant {
			sum := 0.0
			for _, p := range ps {
				p.weight = math.Exp(rng.NormFloat64())
				sum += p.weight
			}
			for _, p := range ps {
				p.demand = total(t) * p.weight / sum
				p.history = append(p.history, p.demand)
			}
		}
	}

	// Per step, for each sampled tenant: admitted, joins (J), changes of
	// subscribers, and the subscribers (Envoys with the bucket).
	type series struct{ admitted, join, events, subs []int }
	sampled := make([]series, min(sc.sample, sc.tenants))
	for i := range sampled {
		sampled[i] = series{make([]int, steps), make([]int, steps), make([]int, steps), make([]int, steps)}
	}
	var tickTime time.Duration
	var ticks int
	// beside are the longest calls made beside each tick.
	var beside []time.Duration
	lease := int((sc.ttl + sc.settle()) / sc.dt)
	// changed marks, for each sampled tenant, that its subscribers change
	// at step: one goes (its share counted until its lease ends) and, at
	// its next report, one comes.
	changed := func(e *envoy, step int, ends ...int) {
		for t := range sampled {
			if e.buckets[tenantName(t)] != nil {
				sampled[t].events[step]++
				for _, end := range ends {
					if step+end < steps {
						sampled[t].events[step+end]++
					}
				}
			}
		}
	}
	// A replica's death: the owners take its subscribers as gone 3 s
	// after its last beat, and each reconnect (at the Envoy's next report,
	// 5 s at most, handed over within 2 s) ends one of their leases Settle
	// after its first grant; an event at each end of that time counts
	// in every window it reaches.
	deathEnds := []int{int((3*time.Second + sc.settle()) / sc.dt), int((sc.interval + 2*time.Second + sc.settle()) / sc.dt)}
	for step := range steps {
		if elapsed := now.Sub(epoch); elapsed%sc.shiftEvery == 0 {
			shift()
			if elapsed > 0 {
				for _, i := range rng.Perm(sc.envoys)[:int(sc.reconnect*float64(sc.envoys))] {
					e := envoys[i]
					if reps[e.rep].dead {
						continue
					}
					changed(e, step, lease)
					e.reconnect()
				}
			}
		}
		if sc.kill > 0 && now.Sub(epoch) == sc.kill {
			// The replica that owns the most pools dies: its streams
			// are cut, its Envoys open new ones to the others at their
			// next report.
			victim := 0
			for i, r := range reps {
				if r.reg.Gauges()["ratelimit.rlqs.shared.owned"] > reps[victim].reg.Gauges()["ratelimit.rlqs.shared.owned"] {
					victim = i
				}
			}
			reps[victim].dead = true
			next := 0
			for _, e := range envoys {
				if e.rep == victim {
					changed(e, step, deathEnds...)
					for next++; reps[next%len(reps)].dead; next++ {
					}
					e.lose(reps[next%len(reps)].q, next%len(reps))
				}
			}
		}
		now = now.Add(sc.dt)
		var ticking sync.WaitGroup
		var tickMu sync.Mutex
		var ticked []*replica
		for _, r := range reps {
			if !r.dead && (now.Sub(epoch)-r.offset)%time.Second == 0 {
				tick := func() {
					began := time.Now()
					r.q.Tick()
					tickMu.Lock()
					tickTime += time.Since(began)
					ticks++
					tickMu.Unlock()
				}
				if sc.concurrent {
					ticking.Go(tick)
					ticked = append(ticked, r)
				} else {
					tick()
				}
			}
		}
		if len(ticked) > 0 {
			beside = append(beside, callBeside(ticked, &ticking))
		}
		for _, e := range envoys {
			e.advance(now, sc.dt)
		}
		sec := int(now.Sub(epoch) / time.Second)
		for _, p := range pairs {
			p.acc += p.demand * sc.dt.Seconds()
			for p.acc >= 1 {
				p.acc--
				ok := p.e.request(now, tenantName(p.tenant))
				if ok && p.perSecond != nil {
					p.perSecond[sec]++
				}
			}
		}
		for _, e := range envoys {
			e.collect(now, time.Duration(rng.Int64N(int64(500*time.Millisecond))))
		}
		ticking.Wait()
		if now.Sub(epoch)%time.Second == 0 {
			for _, p := range pairs {
				if b := p.e.buckets[tenantName(p.tenant)]; p.granted != nil && b != nil && b.action != nil {
					p.granted[sec] = b.rate
				}
			}
		}
		for t := range sampled {
			s := &sampled[t]
			for _, p := range byTenant[t] {
				b := p.e.buckets[tenantName(t)]
				if b == nil {
					continue
				}
				s.admitted[step] += b.stepAllowed
				s.join[step] += b.stepJoin
				res.fallbacks += b.stepFallback
				s.subs[step]++
				b.stepAllowed, b.stepJoin, b.stepFallback = 0, 0, 0
			}
			if step > 0 {
				s.events[step] += abs(s.subs[step] - s.subs[step-1])
			} else {
				s.events[step] += s.subs[step]
			}
		}
		for _, e := range envoys {
			for _, b := range e.buckets {
				res.fallbacks += b.stepFallback
				b.stepAllowed, b.stepJoin, b.stepFallback = 0, 0, 0
			}
		}
	}
	res.buckets = sc.tenants
	var reported uint64
	for _, r := range reps {
		if !r.dead {
			res.subs += int(r.reg.Gauges()["ratelimit.rlqs.subscriptions"])
		}
		reported += r.reg.Counter("ratelimit.rlqs.reports").Value()
		res.takeovers += r.reg.Counter("ratelimit.rlqs.shared.takeovers").Value()
		res.late += r.reg.Counter("ratelimit.rlqs.shared.late_assignments").Value()
	}
	var reportTime time.Duration
	for _, e := range envoys {
		reportTime += e.spent
	}
	if len(beside) > 0 {
		slices.Sort(beside)
		res.waitMedian, res.waitMax = beside[len(beside)/2], beside[len(beside)-1]
	}
	if reported > 0 {
		res.cpuReport = reportTime / time.Duration(reported)
	}
	if ticks > 0 {
		res.cpuTick = tickTime / time.Duration(ticks)
	}
	res.redisLoad = (redisCPU() - redisBefore).Seconds() / sc.duration.Seconds()
	if sc.checks {
		for t := range sampled {
			s := sampled[t]
			sc.checkBound(&res, t, s.admitted, s.join, s.events, s.subs, nil)
		}
		sc.fairness(&res, byTenant[:len(sampled)])
	}
	if sc.replicas == 0 {
		res.heapPerSub = heapPerSubscription(sc, cfg)
	}
	return res, nil
}

func tenantName(t int) string { return "t" + strconv.Itoa(t) }

func abs(n int) int { return max(n, -n) }

// probeEvery is how often callBeside calls a replica: about as often as
// the streams report at 10,000 buckets (3,500 reports a second). A probe
// that called without a pause would take a core from the tick it
// measures.
const probeEvery = 200 * time.Microsecond

// callBeside calls each replica in ticked in turn, every probeEvery, until
// the ticks running in ticking are done, and returns the longest call.
// Each replica gets a session of its own, which has nothing to send: a
// call is the service's lock and nothing else.
func callBeside(ticked []*replica, ticking *sync.WaitGroup) (longest time.Duration) {
	done := make(chan struct{})
	go func() { ticking.Wait(); close(done) }()
	var sessions []*rlqs.Session
	for _, r := range ticked {
		if r.probe == nil {
			s, err := r.q.Open()
			if err != nil {
				continue
			}
			r.probe = s
		}
		sessions = append(sessions, r.probe)
	}
	if len(sessions) == 0 {
		<-done
		return 0
	}
	pace := time.NewTicker(probeEvery)
	defer pace.Stop()
	for n := 0; ; n++ {
		s := sessions[n%len(sessions)]
		began := time.Now()
		s.Take()
		longest = max(longest, time.Since(began))
		select {
		case <-done:
			return longest
		case <-pace.C:
		}
	}
}

// checkBound holds every window of a tenant whose ends fall on a grid of
// 0.5 s, up to 2 minutes long, to docs/RLQS.md's bound.
func (sc scenario) checkBound(res *result, tenant int, admitted, join, events, subs []int, restarts []int) {
	grid := int(500 * time.Millisecond / sc.dt)
	longest := int(2 * time.Minute / sc.dt)
	reach := int((2*sc.settle() + time.Second) / sc.dt)
	learning := int((min(sc.ttl, sc.interval+time.Second) + sc.settle()) / sc.dt)
	if sc.replicas > 0 {
		// The shared pools start at the first tick that makes one.
		learning += int(time.Second / sc.dt)
	}
	// inLearning is the part of [a, z] in the learning period from start.
	inLearning := func(a, z, start int) float64 {
		return float64(max(0, min(z+1, start+learning)-max(a, start))) * sc.dt.Seconds()
	}
	for a := 0; a < len(admitted); a += grid {
		adm, j, ev, n, nMin := 0, 0, 0, 0, math.MaxInt
		for _, e := range events[max(0, a-reach):a] {
			ev += e
		}
		for z := a; z < len(admitted) && z-a < longest; z++ {
			adm += admitted[z]
			j += join[z]
			ev += events[z]
			n = max(n, subs[z])
			nMin = min(nMin, max(1, subs[z]))
			if (z-a+1)%grid != 0 {
				continue
			}
			t := float64(z-a+1) * sc.dt.Seconds()
			bound := sc.rate*t + sc.burst + float64(quota.MinTokens*n) + float64(j) +
				float64(ev)*max(quota.MinTokens, math.Ceil(sc.burst/float64(nMin)))
			// The run starts cold (every bucket new); a restart, with
			// every bucket held before it, has the tighter term.
			if tl := inLearning(a, z, 0); tl > 0 {
				bound += sc.rate*tl + sc.burst
			}
			for _, r := range restarts {
				if tl := inLearning(a, z, r); tl > 0 {
					bound += sc.burst*(1+tl/sc.interval.Seconds()) + quota.DefaultReserve*sc.rate*tl
				}
			}
			res.worst = max(res.worst, float64(adm)/bound)
			if float64(adm) > bound && res.violation == "" {
				res.violation = fmt.Sprintf("tenant %d, window %v..%v: %d admitted > bound %.1f",
					tenant, time.Duration(a)*sc.dt, time.Duration(z+1)*sc.dt, adm, bound)
			}
		}
	}
}

// fairness compares, for each sampled tenant and each period between
// shifts, each Envoy's admitted rate with its max-min fair share of the
// rate less the reserve, given the demands of that period.
func (sc scenario) fairness(res *result, byTenant [][]*pair) {
	periods := int(sc.duration / sc.shiftEvery)
	capacity := sc.rate * (1 - quota.DefaultReserve)
	var sum float64
	var count int
	for _, ps := range byTenant {
		for period := range periods {
			start := int(time.Duration(period) * sc.shiftEvery / time.Second)
			end := start + int(sc.shiftEvery/time.Second)
			demands := make([]float64, len(ps))
			for i, p := range ps {
				demands[i] = p.history[period]
			}
			// What each should admit: its fair share, or its demand when
			// that is less (spare capacity is headroom, not traffic).
			fair := quota.Waterfill(capacity, demands)
			for i := range fair {
				fair[i] = min(fair[i], demands[i])
			}
			deviation := func(from, to int) float64 {
				d := 0.0
				for i, p := range ps {
					n := 0
					for _, c := range p.perSecond[from:to] {
						n += c
					}
					d += math.Abs(float64(n)/float64(to-from) - fair[i])
				}
				return d / sc.rate
			}
			if period > 0 || start+10 < end {
				e := deviation(end-10, end)
				sum += e
				count++
				res.fairWorst = max(res.fairWorst, e)
			}
			if period == 0 {
				continue // the learning period
			}
			// Converged: the grants in force are within 10 % of the
			// service's targets for these demands (spare capacity
			// included) from then until the next shift.
			// The service keeps every subscriber at least a tenth of an
			// equal share, so the spare is spread as if each demanded that.
			floored := make([]float64, len(demands))
			for i, d := range demands {
				floored[i] = max(d, capacity/float64(10*len(demands)))
			}
			target := quota.Waterfill(capacity, floored)
			// A period in which a replica died is measured from its
			// death: how long its Envoys took to be served again.
			killed := sc.kill > 0 && int(sc.kill/time.Second) > start && int(sc.kill/time.Second) < end
			from := start
			if killed {
				from = int(sc.kill / time.Second)
			}
			conv := 0
			for sec := end - 1; sec > from; sec-- {
				d := 0.0
				for i, p := range ps {
					d += math.Abs(p.granted[sec] - target[i])
				}
				if d/sc.rate > 0.1 {
					conv = sec + 1 - from
					break
				}
			}
			if killed {
				res.recovered = max(res.recovered, time.Duration(conv)*time.Second)
				res.served = max(res.served, servedAfter(ps, period, from, end, capacity, sc.rate))
			} else {
				res.converge = max(res.converge, time.Duration(conv)*time.Second)
			}
		}
	}
	if count > 0 {
		res.fairMean = sum / float64(count)
	}
}

// servedAfter is how long after from, in [from, end), every 4 s until end
// had the tenant of ps admit 90 % of min(rate, demand) and each of its
// Envoys 90 % of its max-min fair share of capacity (or its demand, when
// less) for period's demands, but for its tokens; 24 h when never.
func servedAfter(ps []*pair, period, from, end int, capacity, rate float64) time.Duration {
	demands := make([]float64, len(ps))
	total := 0.0
	for i, p := range ps {
		demands[i] = p.history[period]
		total += demands[i]
	}
	fair := quota.Waterfill(capacity, demands)
	for i := range fair {
		fair[i] = min(fair[i], demands[i])
	}
	fair = append(fair, min(rate, total))
	perSecond := make([][]int, end)
	for s := from; s < end; s++ {
		perSecond[s] = make([]int, len(fair))
		for i, p := range ps {
			perSecond[s][i] = p.perSecond[s]
			perSecond[s][len(ps)] += p.perSecond[s]
		}
	}
	// But for the tokens an Envoy's bucket holds: what it admits in a
	// window is its rate's, give or take them.
	if d := reached(perSecond, from, end, fair, quota.MinTokens); d >= 0 {
		return d
	}
	return 24 * time.Hour
}

// heapPerSubscription measures the service's heap per subscription:
// sc.envoys sessions each report every bucket (of sc.tenants spread over
// them, each bucket on two Envoys), then the heap the service holds is
// divided by its subscriptions.
func heapPerSubscription(sc scenario, cfg *rules.Config) float64 {
	now := epoch
	reg := stats.NewRegistry()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	q := rlqs.New(reg, rlqs.Config{
		Pool:                quota.Config{TTL: sc.ttl, Start: epoch.Add(-time.Hour)},
		MaxStreams:          sc.envoys + 1,
		MaxBuckets:          10_000_000,
		MaxBucketsPerStream: 1_000_000,
		Now:                 func() time.Time { return now },
	})
	q.SetRules(cfg)
	var sessions []*rlqs.Session
	for e := range sc.envoys {
		s, err := q.Open()
		if err != nil {
			panic(err)
		}
		sessions = append(sessions, s)
		m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "web"}
		for t := e; t < sc.tenants*2; t += sc.envoys {
			m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
				BucketId:           &rlqsv3.BucketId{Bucket: map[string]string{"name": "api", "tenant": tenantName(t % sc.tenants)}},
				TimeElapsed:        &durationpb.Duration{},
				NumRequestsAllowed: 1,
			})
		}
		if err := s.Report(m); err != nil {
			panic(err)
		}
		s.Take()
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	subs := reg.Gauges()["ratelimit.rlqs.subscriptions"]
	runtime.KeepAlive(sessions)
	runtime.KeepAlive(q)
	if subs == 0 {
		return 0
	}
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(subs)
}

// row writes a result as a row of the report's table.
func (r result) row(sc scenario) string {
	bound := "—"
	if sc.checks {
		bound = fmt.Sprintf("%.2f", r.worst)
		if r.violation != "" {
			bound = "**over: " + r.violation + "**"
		}
	}
	fair, conv := "—", "—"
	if sc.checks {
		fair = fmt.Sprintf("%.1f %%, %.1f %%", 100*r.fairMean, 100*r.fairWorst)
		conv = r.converge.String()
		if sc.kill > 0 {
			served := "not reached"
			if r.served < 24*time.Hour {
				served = r.served.String()
			}
			conv += fmt.Sprintf("; %v after the kill (90 %% of the fair shares after %s)", r.recovered, served)
		}
	}
	shared, redisLoad, heap := "—", "—", "—"
	if sc.replicas > 0 {
		shared = fmt.Sprintf("%d, %d", r.takeovers, r.late)
		redisLoad = fmt.Sprintf("%.1f %%", 100*r.redisLoad)
	} else {
		heap = fmt.Sprintf("%.0f B", r.heapPerSub)
	}
	calls := "—"
	if sc.concurrent {
		calls = fmt.Sprintf("%.2f ms, %.1f ms", float64(r.waitMedian.Nanoseconds())/1e6, float64(r.waitMax.Nanoseconds())/1e6)
	}
	return fmt.Sprintf("| %s | %d | %d | %d | %s | %d | %s | %s | %s | %.1f µs | %s | %.2f ms | %s | %s |",
		sc.name, sc.envoys, r.buckets, r.subs, bound, r.fallbacks, fair, conv, shared,
		float64(r.cpuReport.Nanoseconds())/1e3, calls,
		float64(r.cpuTick.Nanoseconds())/1e6, redisLoad, heap)
}
