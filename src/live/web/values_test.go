package web

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestMaskerShow(t *testing.T) {
	truncated := newMasker(TruncatedValues)
	for _, tt := range []struct{ give, want string }{
		{"", "…"},
		{"b", "…"},
		{"bob", "b…"},
		{"10.0.0.1", "10.0…"},
		{"203.0.113.77", "203.…"},
		{"sk_live_0123456789", "sk_l…"},
		{"éèêë", "éè…"},
	} {
		if got := truncated.show(tt.give); got != tt.want {
			t.Errorf("truncated show(%q) = %q, want %q", tt.give, got, tt.want)
		}
	}
	hashed := newMasker(HashedValues)
	a, b := hashed.show("10.0.0.1"), hashed.show("10.0.0.2")
	if a == b || a != hashed.show("10.0.0.1") || len(a) != 1+2*hashedBytes || !strings.HasPrefix(a, "#") {
		t.Errorf("hashed show: %q, %q; want stable, distinct, # and %d hex digits", a, b, 2*hashedBytes)
	}
	if other := newMasker(HashedValues).show("10.0.0.1"); other == a {
		t.Errorf("two processes hash a value alike (%q): the key must be random", a)
	}
	if got := newMasker(PlainValues).show("10.0.0.1"); got != "10.0.0.1" {
		t.Errorf("plain show = %q", got)
	}
}

// TestTopKeysShowValuesAsAsked: with LIVE_VIEW_VALUES=hashed or truncated
// no request value appears whole in the top keys, in /api/v1/topkeys or
// in the stream's events; keys and rules are shown as they are.
func TestTopKeysShowValuesAsAsked(t *testing.T) {
	const secret = "alice-api-key-0123456789"
	for _, v := range []Values{HashedValues, TruncatedValues} {
		t.Run(v.String(), func(t *testing.T) {
			f := newFixture(t, Config{Values: v})
			f.rec.Tick(f.now())
			f.over(secret)
			f.tick()
			_, b := get(t, f.srv.URL+"/api/v1/topkeys")
			var top topKeysDoc
			if err := json.Unmarshal(b, &top); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(b), secret) || top.Values != v.String() || len(top.Domains) != 1 ||
				top.Domains[0].Keys[0].Entries[0].Key != "user" {
				t.Fatalf("topkeys with values %s: %s", v, b)
			}
			if _, ev := f.h.event(); strings.Contains(string(ev), secret) || !strings.Contains(string(ev), `"user"`) {
				t.Fatalf("stream event with values %s: %s", v, ev)
			}
		})
	}
}
