package main

import (
	"fmt"
	"slices"
	"strings"
)

// The standard scenarios of `make bench` (issue 5). Every scenario runs on
// every store (redis-cluster runs clusterScenarios only), each paired run by
// run with grpc-go's no-op server under the same load.

// scenario is one load shape.
type scenario struct {
	// id is short and stable: it labels the plot, finds rows for the bar
	// and selects scenarios in -scenarios.
	id string
	// title is the table's description.
	title       string
	descriptors []string
	c           int
	// nearCache runs the service with LOCAL_CACHE_SIZE_IN_BYTES set; the
	// memory store has no near cache, so it skips these.
	nearCache bool
}

const usersTemplate = "user_id=user-{0..9999}"

// clusterScenarios are the ids measured on the Redis Cluster: scenario (a)
// at c=64 (issue 5, scaling on paper).
var clusterScenarios = []string{"c64"}

// storeScenarios run against the service on each store.
var storeScenarios = []scenario{
	{id: "c16", title: "(a) 10,000 users, 1 descriptor, c=16", descriptors: []string{usersTemplate}, c: 16},
	{id: "c64", title: "(a) 10,000 users, 1 descriptor, c=64", descriptors: []string{usersTemplate}, c: 64},
	{id: "c256", title: "(a) 10,000 users, 1 descriptor, c=256", descriptors: []string{usersTemplate}, c: 256},
	{id: "hot", title: "(b) hot key over limit, no near cache", descriptors: []string{"hot=1"}, c: 64},
	{id: "hot+nc", title: "(b) hot key over limit, near cache", descriptors: []string{"hot=1"}, c: 64, nearCache: true},
	{id: "chain", title: "(c) 3 descriptors, 3-level nested chain", descriptors: []string{
		"tenant=t-{0..9}",
		"tenant=t-{0..9},route=r-{0..99}",
		"tenant=t-{0..9},route=r-{0..99},user=u-{0..9999}",
	}, c: 64},
	{id: "fixed", title: "(d) fixed_window, 10,000 users", descriptors: []string{"algorithm=fixed_window,user_id=user-{0..9999}"}, c: 64},
	{id: "sliding", title: "(d) sliding_window, 10,000 users", descriptors: []string{"algorithm=sliding_window,user_id=user-{0..9999}"}, c: 64},
	{id: "log", title: "(d) sliding_log, 10,000 users", descriptors: []string{"algorithm=sliding_log,user_id=user-{0..9999}"}, c: 64},
	{id: "bucket", title: "(d) token_bucket, 10,000 users", descriptors: []string{"algorithm=token_bucket,user_id=user-{0..9999}"}, c: 64},
}

// selectScenarios returns the scenarios whose ids are in the comma list
// spec, in the standard order; an empty spec selects all of them.
func selectScenarios(spec string) ([]scenario, error) {
	if strings.TrimSpace(spec) == "" {
		return storeScenarios, nil
	}
	want := map[string]bool{}
	for id := range strings.SplitSeq(spec, ",") {
		if id = strings.TrimSpace(id); id != "" {
			want[id] = true
		}
	}
	var out []scenario
	for _, sc := range storeScenarios {
		if want[sc.id] {
			out = append(out, sc)
			delete(want, sc.id)
		}
	}
	if len(want) > 0 {
		var unknown, ids []string
		for id := range want {
			unknown = append(unknown, id)
		}
		for _, sc := range storeScenarios {
			ids = append(ids, sc.id)
		}
		slices.Sort(unknown)
		return nil, fmt.Errorf("benchrun: -scenarios: unknown %s (want some of %s)", strings.Join(unknown, ", "), strings.Join(ids, ","))
	}
	return out, nil
}

// nearCacheBytes is LOCAL_CACHE_SIZE_IN_BYTES for the near-cache scenario.
const nearCacheBytes = 1 << 20

// algorithms are the values of rate_limit.algorithm, one rule each.
var algorithms = []string{"fixed_window", "sliding_window", "sliding_log", "token_bucket"}

// scenarioAlgorithm returns the algorithm a scenario measures, or "".
func scenarioAlgorithm(sc scenario) string {
	for _, a := range algorithms {
		if strings.HasPrefix(sc.descriptors[0], "algorithm="+a+",") {
			return a
		}
	}
	return ""
}

// rulesYAML returns the domain the scenarios ask, without the rules of the
// algorithms in skip (a store may refuse one it cannot run atomically). Every
// limit but the hot key's is far above what one machine can send, so those
// requests stay under limit.
func rulesYAML(skip map[string]string) string {
	var b strings.Builder
	b.WriteString(rulesHead)
	for _, a := range algorithms {
		if _, ok := skip[a]; ok {
			continue
		}
		limit := 1000000
		if a == "sliding_log" {
			// sliding_log keeps up to requests_per_unit timestamps per key.
			limit = 10000
		}
		fmt.Fprintf(&b, algorithmRule, a, limit, a)
	}
	return b.String()
}

const rulesHead = `# Written by tools/benchrun for the standard scenarios of make bench.
domain: bench
descriptors:
  # (a) 10,000 users, each under its limit.
  - key: user_id
    rate_limit:
      unit: second
      requests_per_unit: 1000000

  # (b) one hot key, over its limit after 10 hits.
  - key: hot
    value: "1"
    rate_limit:
      unit: hour
      requests_per_unit: 10

  # (c) a 3-level nested chain with a limit at every level; each request
  # sends one descriptor per level.
  - key: tenant
    rate_limit:
      unit: second
      requests_per_unit: 1000000
    descriptors:
      - key: route
        rate_limit:
          unit: second
          requests_per_unit: 1000000
        descriptors:
          - key: user
            rate_limit:
              unit: second
              requests_per_unit: 1000000

  # (d) one rule per algorithm, 10,000 users each.
`

const algorithmRule = `  - key: algorithm
    value: %s
    descriptors:
      - key: user_id
        rate_limit:
          unit: second
          requests_per_unit: %d
          algorithm: %s
`
