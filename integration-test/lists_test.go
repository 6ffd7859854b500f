package integration

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/harness"
)

// listRules has a descriptor with a burst and a sustained limit, and
// paths matched exactly, by wildcard, by value_regex and by key.
const listRules = `domain: lists
descriptors:
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: hour, requests_per_unit: 5, name: sustained}
  - key: path
    value: /api/exact
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: path
    value: /api/wild*
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path
    value_regex: /api/v[0-9]+/.*
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 5}
`

// TestRateLimitsAndValueRegexOverTheWire runs both extensions through the
// built binary on every store: the third hit in a second is refused by the
// per-second limit, the sixth in the hour by the sustained one, across
// second boundaries; values match exact > wildcard > value_regex > key;
// /rlconfig lists every limit.
func TestRateLimitsAndValueRegexOverTheWire(t *testing.T) {
	stores := []struct {
		name string
		env  func(t *testing.T) []string
	}{
		{"memory", func(*testing.T) []string { return nil }},
		{"redis", func(t *testing.T) []string { return redisEnv(harness.StartRedis(t, harness.RedisOptions{})) }},
		{"redis_cluster", func(t *testing.T) []string {
			c := harness.StartRedisCluster(t, harness.RedisOptions{})
			return []string{"BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=CLUSTER", "REDIS_URL=" + c.URL}
		}},
		{"memcached", func(t *testing.T) []string { return memcacheEnv(harness.StartMemcached(t)) }},
	}
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			p := start(t, map[string]string{"lists.yaml": listRules}, s.env(t)...)
			c := p.client(t)
			call := func(r *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
				t.Helper()
				resp, err := c.ShouldRateLimit(callCtx(t), r)
				if err != nil {
					t.Fatal(err)
				}
				return resp
			}

			// Precedence, in one request.
			r := request("lists", "path", "/api/exact")
			for _, v := range []string{"/api/wild/x", "/api/v2/users", "/api/other"} {
				r.Descriptors = append(r.Descriptors, &ratelimitv3.RateLimitDescriptor{
					Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "path", Value: v}}})
			}
			for i, want := range []uint32{1, 2, 3, 5} {
				if got := call(r).GetStatuses()[i].GetCurrentLimit().GetRequestsPerUnit(); got != want {
					t.Errorf("descriptor %d: limit %d, want %d", i, got, want)
				}
			}

			// Burst and sustained, second by second, in one hour.
			alignToSecond(t)
			user := request("lists", "user", "alice")
			step := func(want rlsv3.RateLimitResponse_Code, unit rlsv3.RateLimitResponse_RateLimit_Unit) {
				t.Helper()
				st := call(user).GetStatuses()[0]
				if st.GetCode() != want || st.GetCurrentLimit().GetUnit() != unit {
					t.Errorf("%v by %v limit, want %v by %v (%v)", st.GetCode(), st.GetCurrentLimit().GetUnit(), want, unit, st)
				}
			}
			const ok, over = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
			const sec, hour = rlsv3.RateLimitResponse_RateLimit_SECOND, rlsv3.RateLimitResponse_RateLimit_HOUR
			step(ok, sec)
			step(ok, sec)
			step(over, sec) // the third in a second; counted in the hour
			time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 20*time.Millisecond)))
			step(ok, hour) // 1 left in both: the one that resets last
			step(ok, hour)
			time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 20*time.Millisecond)))
			step(over, hour) // the sixth in the hour

			res, err := http.Get("http://" + p.debug + "/rlconfig")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			for _, line := range []string{
				"lists.user: unit=SECOND requests_per_unit=2, shadow_mode: false, quota_mode: false, rate_limits: 1/2 second\n",
				"lists.user: unit=HOUR requests_per_unit=5, shadow_mode: false, quota_mode: false, rate_limits: 2/2 sustained, name: sustained\n",
				"lists.path_~/api/v[0-9]+/.*: unit=HOUR requests_per_unit=3",
			} {
				if !strings.Contains(string(body), line) {
					t.Errorf("/rlconfig lacks %q:\n%s", line, body)
				}
			}
		})
	}
}

// clearOfHourEnd waits for the next hour when this one ends within d, so
// that steps taking less than d count in one hour window.
func clearOfHourEnd(t *testing.T, d time.Duration) {
	t.Helper()
	if next := time.Now().Truncate(time.Hour).Add(time.Hour); time.Until(next) < d {
		time.Sleep(time.Until(next))
	}
}

// alignToSecond waits for the start of a second at least three seconds
// before the end of the hour, so that a few steps fit in one hour window.
func alignToSecond(t *testing.T) {
	t.Helper()
	clearOfHourEnd(t, 4*time.Second)
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 20*time.Millisecond)))
}

// TestInvalidValueRegexExitsNonZero: a pattern that does not compile is a
// config error with file and line, and the service does not start.
func TestInvalidValueRegexExitsNonZero(t *testing.T) {
	p := launch(t, map[string]string{"bad.yaml": "domain: bad\ndescriptors:\n  - key: path\n    value_regex: \"/api/(v1\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n"})
	if code := p.wait(t, 20*time.Second); code == 0 {
		t.Fatal("service started with an invalid value_regex")
	}
	for _, want := range []string{"bad.yaml:4:", "value_regex: invalid regular expression", "missing closing )"} {
		if !strings.Contains(p.logs(), want) {
			t.Errorf("logs lack %q:\n%s", want, p.logs())
		}
	}
}
