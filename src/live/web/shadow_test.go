package web

import (
	"slices"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// TestShadowLimitDocuments: /api/v1/rules marks a shadow limit and links
// it to its twin; /api/v1/topkeys marks a key it would refuse.
func TestShadowLimitDocuments(t *testing.T) {
	f := newFixture(t, Config{})
	c, err := rules.Parse([]rules.File{{Name: "s.yaml", Data: []byte(`domain: api
descriptors:
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 10}
      - {unit: hour, requests_per_unit: 2, shadow_mode: true, name: strict}
`)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.cfg = c
	f.rec.SetRules(c)

	var doc rulesDoc
	getJSON(t, f.srv.URL+"/api/v1/rules", &doc)
	byID := map[string]ruleDoc{}
	for _, r := range doc.Domains[0].Rules {
		byID[r.ID] = r
	}
	if r := byID["api.user.strict"]; !r.Shadow || r.ShadowMode || !slices.Equal(r.Twins, []string{"api.user.minute"}) {
		t.Errorf("shadow limit: %+v, want shadow, twin of api.user.minute", r)
	}
	if r := byID["api.user.minute"]; r.Shadow || !slices.Equal(r.Twins, []string{"api.user.strict"}) {
		t.Errorf("enforced limit: %+v, want its twin api.user.strict", r)
	}

	f.rec.Tick(f.now())
	strict := c.Match("api", []rules.Entry{{Key: "user", Value: "x"}}).Limit.Limits[1]
	st := limiter.Status{Limit: strict, Code: limiter.OverLimit, ResetAfter: time.Hour,
		Counts: limiter.Counts{TotalHits: 1, NearLimit: 1, ShadowOverLimit: 1}}
	f.rec.Observe("api", []rules.Entry{{Key: "user", Value: "eve"}}, strict, &st, f.now())
	var top topKeysDoc
	getJSON(t, f.srv.URL+"/api/v1/topkeys", &top)
	if len(top.Domains) != 1 || len(top.Domains[0].Keys) != 1 {
		t.Fatalf("topkeys: %+v", top)
	}
	if k := top.Domains[0].Keys[0]; k.Rule != "api.user.strict" || !k.Over || !k.Shadow {
		t.Errorf("top key: %+v, want eve, which the shadow limit would refuse", k)
	}
}
