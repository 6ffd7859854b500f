package rules_test

import (
	"fmt"

	"github.com/ratelimitd/ratelimit/src/rules"
)

func ExampleDiff() {
	parse := func(yaml string) *rules.Config {
		cfg, err := rules.Parse([]rules.File{{Name: "edge.yaml", Data: []byte(yaml)}}, rules.Options{})
		if err != nil {
			fmt.Println(err)
		}
		return cfg
	}
	from := parse(`
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100}
`)
	to := parse(`
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: sliding_window}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000}
`)
	for _, c := range rules.Diff(from, to) {
		fmt.Println(c)
	}
	// Output:
	// ~ edge.api_key: algorithm fixed_window -> sliding_window (counters restart)
	// ~ edge.remote_address: requests_per_unit 10 -> 20
	// + edge.user: unit=HOUR requests_per_unit=1000, shadow_mode: false, quota_mode: false
}
