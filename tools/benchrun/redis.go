package main

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
)

// Redis for the benchmark: one redis-server or the harness's three-master
// cluster, the CPU time and commands they spend per decision (read from INFO,
// so the figures hold for any client of Redis, this service or another), and
// the capacity of one Redis measured with redis-benchmark.

// startRedis starts one redis-server under dir for the service's scenarios.
func startRedis(dir string) (*backend, error) {
	s, err := launchRedis(dir)
	if err != nil {
		return nil, err
	}
	return &backend{
		stop:   func() { _ = s.Close() },
		redis:  []*harness.RedisServer{s},
		env:    []string{"BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=SINGLE", "REDIS_URL=" + s.Addr},
		rtStat: redisRoundTrips,
	}, nil
}

// launchRedis starts a plain redis-server whose files live in dir.
func launchRedis(dir string) (*harness.RedisServer, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("benchrun: %w", err)
	}
	s, err := harness.LaunchRedis(dir, harness.RedisOptions{})
	if err != nil {
		return nil, fmt.Errorf("benchrun: %w", err)
	}
	return s, nil
}

// startRedisCluster starts the three-master cluster the tests use (16384
// slots split evenly, no replicas) under dir.
func startRedisCluster(dir string) (*backend, error) {
	c, err := harness.LaunchRedisCluster(dir, harness.RedisOptions{})
	if err != nil {
		return nil, fmt.Errorf("benchrun: %w", err)
	}
	return &backend{
		stop:   func() { _ = c.Close() },
		redis:  c.Masters,
		env:    []string{"BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=CLUSTER", "REDIS_URL=" + c.URL},
		rtStat: redisRoundTrips,
	}, nil
}

// redisUsage is what a set of Redis servers has spent since it started.
type redisUsage struct {
	// cpu is used_cpu_user + used_cpu_sys: the whole process, in seconds.
	cpu float64
	// commands is total_commands_processed, which counts the commands a
	// script calls as well as the script itself.
	commands float64
}

// readRedisUsage sums INFO's CPU and command counters over servers.
func readRedisUsage(ctx context.Context, servers []*harness.RedisServer) (redisUsage, error) {
	var u redisUsage
	for _, s := range servers {
		reply, err := s.Do(ctx, "INFO")
		if err != nil {
			return u, fmt.Errorf("benchrun: redis %s: INFO: %w", s.Addr, err)
		}
		info, _ := reply.(string)
		one, err := parseRedisUsage(info)
		if err != nil {
			return u, fmt.Errorf("benchrun: redis %s: %w", s.Addr, err)
		}
		u.cpu += one.cpu
		u.commands += one.commands
	}
	return u, nil
}

// parseRedisUsage reads used_cpu_user, used_cpu_sys and
// total_commands_processed from an INFO reply.
func parseRedisUsage(info string) (redisUsage, error) {
	fields := map[string]float64{}
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "used_cpu_user", "used_cpu_sys", "total_commands_processed":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return redisUsage{}, fmt.Errorf("INFO %s: %w", k, err)
			}
			fields[k] = f
		}
	}
	if len(fields) != 3 {
		return redisUsage{}, fmt.Errorf("INFO lacks used_cpu_user, used_cpu_sys or total_commands_processed (got %d of 3)", len(fields))
	}
	return redisUsage{cpu: fields["used_cpu_user"] + fields["used_cpu_sys"], commands: fields["total_commands_processed"]}, nil
}

// capacityResult is one redis-benchmark test against one redis-server.
type capacityResult struct {
	// load says what the test stands for; command is what it sends.
	load, command               string
	pipeline, clients, requests int
	// rps is redis-benchmark's requests/s; p50 its median latency (0 when
	// this redis-benchmark does not report it).
	rps float64
	p50 time.Duration
	// cpuUS is the server's CPU per request (INFO), NaN if unread.
	cpuUS float64
}

// gcraLua is a small token bucket (GCRA) of the shape of the service's Lua
// algorithms: read the time, read one key, decide, write it back with a
// TTL. ARGV: microseconds per token, burst tolerance in microseconds. The
// time is written with string.format: Lua's own number-to-string keeps 14
// digits, too few for Unix microseconds.
const gcraLua = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local new = tat + tonumber(ARGV[1])
if new - now > tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], string.format('%.0f', new), 'PX', math.ceil((new - now) / 1000))
return 1
`

// capacityTimeout bounds each redis-benchmark test.
const capacityTimeout = time.Minute

// measureCapacity starts a redis-server of its own under dir, on 127.0.0.1
// only, and measures with redis-benchmark what one Redis (one cluster
// shard) answers: INCRBY (the fixed window's command) pipelined as a
// busy client pipelines, INCRBY one at a time, and EVALSHA of gcraLua.
// requests is the size of the pipelined INCRBY test; the slower ones send
// a fifth of it.
func measureCapacity(ctx context.Context, dir string, requests int, logf func(string, ...any)) ([]capacityResult, error) {
	path, err := exec.LookPath("redis-benchmark")
	if err != nil {
		return nil, errors.New("benchrun: redis-benchmark not found in PATH; install it (Debian/Ubuntu: apt-get install redis-tools, which redis-server pulls in; macOS: brew install redis), or pass -redis-benchmark=false")
	}
	s, err := launchRedis(dir)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	reply, err := s.Do(ctx, "SCRIPT", "LOAD", gcraLua)
	if err != nil {
		return nil, fmt.Errorf("benchrun: redis SCRIPT LOAD: %w", err)
	}
	sha, _ := reply.(string)
	// redis-benchmark counts error replies as answers: make sure there are none.
	if reply, err := s.Do(ctx, "EVALSHA", sha, "1", "rl:probe", "1000", "1000000"); err != nil || reply != int64(1) {
		return nil, fmt.Errorf("benchrun: redis: the token bucket script answers %v, %v; want 1", reply, err)
	}
	tests := []capacityResult{
		{load: "fixed window (INCRBY), pipelined", command: "INCRBY rl:__rand_int__ 1", pipeline: 16, clients: 50, requests: requests},
		{load: "fixed window (INCRBY), no pipelining", command: "INCRBY rl:__rand_int__ 1", pipeline: 1, clients: 50, requests: max(requests/5, 1)},
		{load: "Lua token bucket (EVALSHA), pipelined", command: "EVALSHA " + sha + " 1 rl:__rand_int__ 1000 1000000", pipeline: 16, clients: 50, requests: max(requests/5, 1)},
	}
	for i := range tests {
		tt := &tests[i]
		logf("benchrun: redis-benchmark: %s: %d requests", tt.load, tt.requests)
		u0, err0 := readRedisUsage(ctx, []*harness.RedisServer{s})
		if err := runRedisBenchmark(ctx, path, s.Addr, tt); err != nil {
			return nil, err
		}
		tt.cpuUS = nan()
		if u1, err1 := readRedisUsage(ctx, []*harness.RedisServer{s}); err0 == nil && err1 == nil {
			tt.cpuUS = (u1.cpu - u0.cpu) * 1e6 / float64(tt.requests)
		}
		logf("benchrun: redis-benchmark: %s: %.0f req/s, Redis CPU %.2f µs/request", tt.load, tt.rps, tt.cpuUS)
	}
	// The command line shows the script's hash; the report names it.
	tests[2].command = "EVALSHA <token bucket> 1 rl:__rand_int__ 1000 1000000"
	return tests, nil
}

// runRedisBenchmark runs one test on addr (10,000 random keys) and sets
// tt.rps and tt.p50 from its CSV output.
func runRedisBenchmark(ctx context.Context, path, addr string, tt *capacityResult) error {
	host, port, _ := strings.Cut(addr, ":")
	ctx, cancel := context.WithTimeout(ctx, capacityTimeout)
	defer cancel()
	args := []string{"-h", host, "-p", port, "-c", strconv.Itoa(tt.clients), "-n", strconv.Itoa(tt.requests),
		"-P", strconv.Itoa(tt.pipeline), "-r", "10000", "--csv"}
	args = append(args, strings.Fields(tt.command)...)
	out, err := exec.CommandContext(ctx, path, args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return fmt.Errorf("benchrun: redis-benchmark %s: %w", strings.Join(args, " "), err)
	}
	rps, p50, err := parseBenchmarkCSV(string(out))
	if err != nil {
		return fmt.Errorf("benchrun: redis-benchmark %s: %w", strings.Join(args, " "), err)
	}
	tt.rps, tt.p50 = rps, p50
	return nil
}

// parseBenchmarkCSV reads the requests/s and, when there is a header with
// p50_latency_ms (Redis 7), the median latency of redis-benchmark --csv.
func parseBenchmarkCSV(out string) (rps float64, p50 time.Duration, err error) {
	records, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		return 0, 0, fmt.Errorf("csv: %w", err)
	}
	p50Col := -1
	for _, rec := range records {
		if len(rec) < 2 {
			continue
		}
		if rec[0] == "test" {
			for i, h := range rec {
				if h == "p50_latency_ms" {
					p50Col = i
				}
			}
			continue
		}
		rps, err = strconv.ParseFloat(rec[1], 64)
		if err != nil {
			return 0, 0, fmt.Errorf("csv: requests/s %q: %w", rec[1], err)
		}
		if p50Col > 0 && p50Col < len(rec) {
			if ms, err := strconv.ParseFloat(rec[p50Col], 64); err == nil {
				p50 = time.Duration(ms * float64(time.Millisecond))
			}
		}
		return rps, p50, nil
	}
	return 0, 0, fmt.Errorf("no result in %q", strings.TrimSpace(out))
}
