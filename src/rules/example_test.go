package rules_test

import (
	"fmt"

	"github.com/ratelimitd/ratelimit/src/rules"
)

func ExampleParse() {
	yaml := `
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: remote_address
    value: 10.0.0.1
    rate_limit:
      unlimited: true
  - key: api_key
    rate_limit:
      unit: second
      requests_per_unit: 5
      algorithm: token_bucket
      burst: 20
`
	cfg, err := rules.Parse([]rules.File{{Name: "edge.yaml", Data: []byte(yaml)}}, rules.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print(cfg.Dump())
	// Output:
	// edge.api_key: unit=SECOND requests_per_unit=5, shadow_mode: false, quota_mode: false, algorithm: token_bucket, burst: 20
	// edge.remote_address: unit=SECOND requests_per_unit=10, shadow_mode: false, quota_mode: false
	// edge.remote_address_10.0.0.1: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false, unlimited: true
}

func ExampleParse_errors() {
	yaml := `
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: fortnight
      requests_per_unit: 10
  - key: path
    ratelimit:
      unit: second
`
	_, err := rules.Parse([]rules.File{{Name: "edge.yaml", Data: []byte(yaml)}}, rules.Options{})
	fmt.Println(err)
	// Output:
	// rules: edge.yaml:6: descriptor "edge.remote_address": rate_limit: invalid unit "fortnight" (want second, minute, hour, day, week, month or year)
	// rules: edge.yaml:9: descriptor "edge.path": unknown key "ratelimit" (did you mean "rate_limit"?)
}

func ExampleConfig_Match() {
	yaml := `
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    detailed_metric: true
    rate_limit:
      unit: day
      requests_per_unit: 100
  - key: files
    value: reports/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 50
`
	cfg, err := rules.Parse([]rules.File{{Name: "messaging.yaml", Data: []byte(yaml)}}, rules.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, d := range [][]rules.Entry{
		{{Key: "message_type", Value: "marketing"}, {Key: "to_number", Value: "2061111111"}},
		{{Key: "to_number", Value: "2061111111"}},
		{{Key: "files", Value: "reports/q3.pdf"}},
		{{Key: "message_type", Value: "marketing"}},
	} {
		m := cfg.Match("messaging", d)
		if m.Limit == nil {
			fmt.Printf("%v: no limit\n", d)
			continue
		}
		fmt.Printf("%v: %d per %s, rule %s, counted as %s, cache key entries %v\n",
			d, m.Limit.RequestsPerUnit, m.Limit.Unit, m.Limit.FullKey, m.StatKey, m.KeyEntries)
	}
	// Output:
	// [{message_type marketing} {to_number 2061111111}]: 5 per DAY, rule messaging.message_type_marketing.to_number, counted as messaging.message_type_marketing.to_number, cache key entries []
	// [{to_number 2061111111}]: 100 per DAY, rule messaging.to_number, counted as messaging.to_number_2061111111, cache key entries []
	// [{files reports/q3.pdf}]: 50 per HOUR, rule messaging.files_reports/*, counted as messaging.files_reports/*, cache key entries [{files reports/*}]
	// [{message_type marketing}]: no limit
}
