package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/ratelimitd/ratelimit/src/rlqs"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/stats"
)

// dynamics runs the fleet changes docs/RLQS.md times, on one replica:
// four Envoy-like clients offering 2, 4, 8 and 16 requests a second of
// one tenant of 10/s (burst 10) start with a fresh service (a cold
// start); at 0:40 the 16/s one falls to 1/s (a demand drop); at 1:10 a
// fifth joins with 6/s; at 1:40 the service restarts (a new process: the
// Envoys keep their grants and open new streams at their next report).
// For each it finds how long until every client admitted at least 90 %
// of its max-min fair share over every 4 s until the next change, and
// holds the tenant's admitted requests to the bound over every window.
type dynamics struct {
	name string
	// discrete: the clients read token buckets as the proto's text does.
	discrete bool
	seed     uint64
}

// dynEvent is one change of the fleet and the fair shares after it.
type dynEvent struct {
	name string
	at   time.Duration
	fair []float64
}

// dynResult is what a dynamics run found: for each event, the time to
// 90 % of the fair shares (-1: not within the event's span).
type dynResult struct {
	events  []dynEvent
	reached []time.Duration
	worst   float64
	// violation describes the first window over its bound.
	violation string
}

func runDynamics(w io.Writer) error {
	fmt.Fprintln(w, "| clients | cold start | demand drop | join | restart | worst window / bound |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, d := range []dynamics{{name: "Envoy 1.40", seed: 1}, {name: "the proto's reading", discrete: true, seed: 1}} {
		r, err := d.run()
		if err != nil {
			return fmt.Errorf("%s: %w", d.name, err)
		}
		fmt.Fprintf(w, "| %s |", d.name)
		for _, at := range r.reached {
			if at < 0 {
				fmt.Fprint(w, " not reached |")
			} else {
				fmt.Fprintf(w, " %v |", at)
			}
		}
		fmt.Fprintf(w, " %.2f |\n", r.worst)
		if r.violation != "" {
			fmt.Fprintln(w, "bound exceeded:", r.violation)
		}
	}
	return nil
}

func (d dynamics) run() (dynResult, error) {
	sc := scenario{
		envoys: 5, tenants: 1, rate: 10, burst: 10, interval: 5 * time.Second, ttl: 15 * time.Second,
		duration: 130 * time.Second, dt: 10 * time.Millisecond,
	}
	var res dynResult
	rng := rand.New(rand.NewPCG(d.seed, 38))
	now := epoch
	clock := func() time.Time { return now }
	cfg, err := rules.Parse([]rules.File{{Name: "sim.yaml", Data: []byte(sc.rules())}}, rules.Options{})
	if err != nil {
		return res, err
	}
	service := func(start time.Time) *rlqs.Service {
		q := rlqs.New(stats.NewRegistry(), sc.config(clock, start))
		q.SetRules(cfg)
		return q
	}
	q := service(epoch)
	tenant := tenantName(0)
	type client struct {
		e      *envoy
		demand float64
		acc    float64
	}
	var clients []*client
	add := func(demand float64) {
		e := newEnvoy(len(clients), sc.interval, q)
		e.discrete = d.discrete
		clients = append(clients, &client{e: e, demand: demand})
	}
	for _, r := range []float64{2, 4, 8, 16} {
		add(r)
	}
	res.events = []dynEvent{
		{"cold start", 0, []float64{2, 8.0 / 3, 8.0 / 3, 8.0 / 3}},
		{"demand drop", 40 * time.Second, []float64{2, 3.5, 3.5, 1}},
		{"join", 70 * time.Second, []float64{2, 7.0 / 3, 7.0 / 3, 1, 7.0 / 3}},
		{"restart", 100 * time.Second, []float64{2, 7.0 / 3, 7.0 / 3, 1, 7.0 / 3}},
	}
	steps := int(sc.duration / sc.dt)
	admitted, join, events, subs := make([]int, steps), make([]int, steps), make([]int, steps), make([]int, steps)
	// perSecond[s][i] is what client i admitted in second s.
	perSecond := make([][]int, int(sc.duration/time.Second)+1)
	for i := range perSecond {
		perSecond[i] = make([]int, 5)
	}
	var restarts []int
	for step := range steps {
		switch now.Sub(epoch) {
		case 40 * time.Second:
			clients[3].demand = 1
		case 70 * time.Second:
			add(6)
		case 100 * time.Second:
			// A new process: the streams end without a word, the
			// Envoys keep their grants and report to it next.
			q = service(now)
			for _, c := range clients {
				c.e.lose(q, 0)
			}
			restarts = append(restarts, step)
		}
		now = now.Add(sc.dt)
		if now.Sub(epoch)%time.Second == 0 {
			q.Tick()
		}
		sec := int(now.Sub(epoch) / time.Second)
		for i, c := range clients {
			c.e.advance(now, sc.dt)
			for c.acc += c.demand * sc.dt.Seconds(); c.acc >= 1; c.acc-- {
				if c.e.request(now, tenant) {
					perSecond[sec][i]++
				}
			}
			c.e.collect(now, time.Duration(rng.Int64N(int64(500*time.Millisecond))))
			if b := c.e.buckets[tenant]; b != nil {
				admitted[step] += b.stepAllowed
				join[step] += b.stepJoin
				subs[step]++
				b.stepAllowed, b.stepJoin, b.stepFallback = 0, 0, 0
			}
		}
		if step > 0 {
			events[step] = abs(subs[step] - subs[step-1])
		}
	}
	var br result
	sc.checkBound(&br, 0, admitted, join, events, subs, restarts)
	res.worst, res.violation = br.worst, br.violation
	for i, ev := range res.events {
		end := len(perSecond) - 1
		if i+1 < len(res.events) {
			end = int(res.events[i+1].at / time.Second)
		}
		res.reached = append(res.reached, reached(perSecond, int(ev.at/time.Second), end, ev.fair, 1))
	}
	return res, nil
}

// reached returns how long after from every client admitted at least 90 %
// of its fair share over every 4 s until end (but for slack requests: one
// of rounding, the counts being whole, or more), or -1 if that never held.
func reached(perSecond [][]int, from, end int, fair []float64, slack float64) time.Duration {
	const span = 4
	first := -1
	for a := end - span; a >= from; a-- {
		for i, f := range fair {
			n := 0
			for s := a; s < a+span; s++ {
				n += perSecond[s][i]
			}
			if float64(n) < 0.9*f*span-slack {
				return sinceFrom(first, from)
			}
		}
		first = a
	}
	return sinceFrom(first, from)
}

func sinceFrom(first, from int) time.Duration {
	if first < 0 {
		return -1
	}
	return time.Duration(first-from) * time.Second
}
