package rules

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse checks that no input panics Parse, that every problem is an
// *Error, and that parsing is deterministic: the same bytes give the same
// Dump, and matching the parsed tree, or a bucket id against its quota
// rules, does not panic either.
func FuzzParse(f *testing.F) {
	for _, pattern := range []string{"testdata/*.yaml", "testdata/match/*.yaml", "testdata/quota/*.yaml"} {
		paths, err := filepath.Glob(pattern)
		if err != nil {
			f.Fatal(err)
		}
		for _, p := range paths {
			data, err := os.ReadFile(p)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file := []File{{Name: "fuzz.yaml", Data: data}}
		cfg, err := Parse(file, Options{})
		if err != nil {
			if cfg != nil {
				t.Fatal("Parse returned a config along with an error")
			}
			var j interface{ Unwrap() []error }
			if !errors.As(err, &j) {
				t.Fatalf("Parse error %T is not joined", err)
			}
			for _, e := range j.Unwrap() {
				var re *Error
				if !errors.As(e, &re) {
					t.Fatalf("Parse error %q is not a *rules.Error", e)
				}
			}
			return
		}
		again, err := Parse(file, Options{})
		if err != nil {
			t.Fatalf("second Parse failed: %v", err)
		}
		if cfg.Dump() != again.Dump() {
			t.Fatalf("Dump differs between two parses:\n%s\n---\n%s", cfg.Dump(), again.Dump())
		}
		for _, d := range cfg.Domains() {
			for _, e := range [][]Entry{
				nil,
				{{Key: "key1", Value: "value1"}},
				{{Key: "key1", Value: ""}, {Key: "subkey1", Value: "x"}},
				{{Key: "path", Value: "/v1/users/42"}, {Key: "a", Value: "b"}, {Key: "c", Value: "d"}},
			} {
				cfg.Match(d, e)
				id := map[string]string{}
				for _, kv := range e {
					id[kv.Key] = kv.Value
				}
				cfg.MatchQuota(d, id)
			}
		}
	})
}
