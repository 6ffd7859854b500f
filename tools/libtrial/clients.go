package main

import (
	"context"
	"errors"
	"net"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/redis"
)

// client applies one decision: a fixed-window hit on each key (INCRBY, then
// EXPIRE), all of a call's commands in one round trip where the client
// allows it. Each is safe for concurrent use.
type client interface {
	decide(ctx context.Context, c *caller) error
	close()
}

// caller is one concurrent caller's reusable state.
type caller struct {
	keys  []string
	batch limiter.Batch
	// for the other clients
	gcmds []*goredis.IntCmd
	futs  []goredis.AutoFuture
	rcmds rueidis.Commands
}

// window is the fixed window of every op; ttl its EXPIRE, in seconds.
const (
	window = time.Hour
	ttl    = int64(window / time.Second)
)

// ours is the production store, src/store/redis, with its own pipeline
// scheduler (pipeline.go).
type ours struct{ s *redis.Store }

// newOurs starts the store with its defaults but the request timeout;
// poolSize 0 is REDIS_POOL_SIZE's default.
func newOurs(addr string, timeout time.Duration, poolSize int) (client, error) {
	s, err := redis.New(context.Background(), redis.Config{URL: addr, Timeout: timeout, PoolSize: poolSize})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.WaitStarted(ctx); err != nil {
		_ = s.Close()
		return nil, err
	}
	return ours{s}, nil
}

func (o ours) decide(ctx context.Context, c *caller) error {
	b := &c.batch
	b.Now = time.Now()
	b.Ops = b.Ops[:0]
	for _, k := range c.keys {
		b.Ops = append(b.Ops, limiter.Op{Key: k, Algorithm: rules.FixedWindow, Limit: 1 << 40, Window: window, Hits: 1})
	}
	return o.s.Do(ctx, b)
}

func (o ours) close() { _ = o.s.Close() }

// goredisAP is go-redis's own automatic pipeliner, deferred face: a call
// submits its commands and then waits for them, so that they share one
// batch; fullDuplex selects the experimental full-duplex engine.
type goredisAP struct {
	c  *goredis.Client
	ap *goredis.AutoPipeliner
}

func newGoredisAP(addr string, timeout time.Duration, fullDuplex bool) (client, error) {
	c := goredis.NewClient(&goredis.Options{
		Addr: addr, MaxRetries: -1, DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout,
		AutoPipelineOptions: &goredis.AutoPipelineOptions{FullDuplex: fullDuplex},
	})
	ap, err := c.AsyncAutoPipeline()
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	return goredisAP{c, ap}, nil
}

func (g goredisAP) decide(ctx context.Context, c *caller) error {
	c.gcmds, c.futs = c.gcmds[:0], c.futs[:0]
	for _, k := range c.keys {
		incr := goredis.NewIntCmd(ctx, "incrby", k, 1)
		exp := goredis.NewIntCmd(ctx, "expire", k, ttl)
		c.gcmds = append(c.gcmds, incr)
		c.futs = append(c.futs, g.ap.Submit(ctx, incr), g.ap.Submit(ctx, exp))
	}
	for _, f := range c.futs {
		if err := f.WaitContext(ctx); err != nil {
			return err
		}
	}
	for _, cmd := range c.gcmds {
		if cmd.Val() <= 0 {
			return errors.New("go-redis: no count")
		}
	}
	return nil
}

func (g goredisAP) close() {
	_ = g.ap.Close()
	_ = g.c.Close()
}

// rueidisClient is github.com/redis/rueidis, which pipelines concurrent
// calls on a shared connection by default; a call's commands go as one
// DoMulti.
type rueidisClient struct{ c rueidis.Client }

func newRueidis(addr string, timeout time.Duration) (client, error) {
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:      []string{addr},
		DisableCache:     true, // client-side caching is of no use to counters
		DisableRetry:     true, // INCRBY twice is a double count
		ConnWriteTimeout: timeout,
		Dialer:           net.Dialer{Timeout: timeout},
	})
	if err != nil {
		return nil, err
	}
	return rueidisClient{c}, nil
}

func (r rueidisClient) decide(ctx context.Context, c *caller) error {
	c.rcmds = c.rcmds[:0]
	for _, k := range c.keys {
		c.rcmds = append(c.rcmds,
			r.c.B().Incrby().Key(k).Increment(1).Build(),
			r.c.B().Expire().Key(k).Seconds(ttl).Build())
	}
	for i, res := range r.c.DoMulti(ctx, c.rcmds...) {
		n, err := res.AsInt64()
		if err != nil {
			return err
		}
		if i%2 == 0 && n <= 0 {
			return errors.New("rueidis: no count")
		}
	}
	return nil
}

func (r rueidisClient) close() { r.c.Close() }

// keyName is the name of key i of a run.
func keyName(prefix string, i uint64) string {
	return prefix + strconv.FormatUint(i, 10)
}
