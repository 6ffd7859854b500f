package loadgen

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

func TestParseTemplateErrors(t *testing.T) {
	tests := []struct {
		name string
		give string
		want string
	}{
		{name: "empty", give: "", want: "empty descriptor template"},
		{name: "no_equals", give: "user_id", want: "want key=value"},
		{name: "empty_key", give: "=v", want: "empty key"},
		{name: "empty_entry", give: "a=b,", want: "want key=value"},
		{name: "unterminated_range", give: "k=v{0..9", want: "unterminated range"},
		{name: "no_dots", give: "k={0-9}", want: "want {lo..hi}"},
		{name: "reversed_range", give: "k={9..0}", want: "lo <= hi"},
		{name: "negative", give: "k={-1..5}", want: "lo <= hi"},
		{name: "not_a_number", give: "k={a..b}", want: "lo <= hi"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseTemplate(tt.give)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ParseTemplate(%q) error = %v, want one containing %q", tt.give, err, tt.want)
			}
		})
	}
}

func TestTemplateExpand(t *testing.T) {
	// inRange reports whether s is prefix+n+suffix with lo <= n <= hi.
	inRange := func(s, prefix, suffix string, lo, hi int64) bool {
		if !strings.HasPrefix(s, prefix) || !strings.HasSuffix(s, suffix) || len(s) < len(prefix)+len(suffix)+1 {
			return false
		}
		n, err := strconv.ParseInt(s[len(prefix):len(s)-len(suffix)], 10, 64)
		return err == nil && n >= lo && n <= hi
	}
	tests := []struct {
		name     string
		give     string
		wantSize int64
		// check validates one expansion.
		check func(kv [][2]string) bool
	}{
		{
			name:     "literal",
			give:     "hot=1",
			wantSize: 1,
			check:    func(kv [][2]string) bool { return len(kv) == 1 && kv[0] == [2]string{"hot", "1"} },
		},
		{
			name:     "users",
			give:     "user_id=user-{0..9999}",
			wantSize: 10000,
			check: func(kv [][2]string) bool {
				return len(kv) == 1 && kv[0][0] == "user_id" && inRange(kv[0][1], "user-", "", 0, 9999)
			},
		},
		{
			name:     "nested_chain",
			give:     "a=x,b=y-{0..9},c=z",
			wantSize: 10,
			check: func(kv [][2]string) bool {
				return len(kv) == 3 && kv[0] == [2]string{"a", "x"} && kv[1][0] == "b" &&
					inRange(kv[1][1], "y-", "", 0, 9) && kv[2] == [2]string{"c", "z"}
			},
		},
		{
			name:     "range_in_key_and_offset",
			give:     "k{1..3}=v{100..199}s",
			wantSize: 300,
			check: func(kv [][2]string) bool {
				return len(kv) == 1 && inRange(kv[0][0], "k", "", 1, 3) && inRange(kv[0][1], "v", "s", 100, 199)
			},
		},
		{
			name:     "beyond_precompute",
			give:     "id={5..10000004}",
			wantSize: 10000000,
			check: func(kv [][2]string) bool {
				return len(kv) == 1 && inRange(kv[0][1], "", "", 5, 10000004)
			},
		},
		{
			name:     "two_ranges_in_a_value",
			give:     "k={0..1}-{0..2}",
			wantSize: 6,
			check: func(kv [][2]string) bool {
				a, b, ok := strings.Cut(kv[0][1], "-")
				return ok && inRange(a, "", "", 0, 1) && inRange(b, "", "", 0, 2)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmpl, err := ParseTemplate(tt.give)
			if err != nil {
				t.Fatalf("ParseTemplate(%q): %v", tt.give, err)
			}
			if got := tmpl.Size(); got != tt.wantSize {
				t.Errorf("Size() = %d, want %d", got, tt.wantSize)
			}
			r := rand.New(rand.NewPCG(1, 2))
			seen := map[string]bool{}
			for range 2000 {
				kv := tmpl.Expand(r)
				if !tt.check(kv) {
					t.Fatalf("Expand() = %q, not an expansion of %q", kv, tt.give)
				}
				seen[fmt.Sprint(kv)] = true
			}
			// Small key spaces are covered in full: the draws span every range.
			if tt.wantSize <= 10 && int64(len(seen)) != tt.wantSize {
				t.Errorf("2000 expansions gave %d distinct descriptors, want %d", len(seen), tt.wantSize)
			}
		})
	}
}

// TestWorkerRequest checks that the pre-built request of a worker carries
// every template as one descriptor, in order, and that next() varies only the
// ranged parts.
func TestWorkerRequest(t *testing.T) {
	var tmpls []*Template
	for _, s := range []string{"user_id=user-{0..9999}", "a=x,b=y-{0..9},c=z"} {
		tmpl, err := ParseTemplate(s)
		if err != nil {
			t.Fatal(err)
		}
		tmpls = append(tmpls, tmpl)
	}
	w := newWorker(nil, &Load{Domain: "bench", Hits: 3}, tmpls, 7)
	users := map[string]bool{}
	for range 100 {
		w.next()
		req := w.req
		if req.GetDomain() != "bench" || req.GetHitsAddend() != 3 || len(req.GetDescriptors()) != 2 {
			t.Fatalf("request = %v, want domain bench, hits 3 and 2 descriptors", req)
		}
		users[req.GetDescriptors()[0].GetEntries()[0].GetValue()] = true
		chain := req.GetDescriptors()[1].GetEntries()
		if len(chain) != 3 || chain[0].GetKey() != "a" || chain[0].GetValue() != "x" ||
			chain[1].GetKey() != "b" || !strings.HasPrefix(chain[1].GetValue(), "y-") || chain[2].GetValue() != "z" {
			t.Fatalf("chain = %v, want a=x,b=y-N,c=z", chain)
		}
	}
	if len(users) < 90 {
		t.Errorf("100 requests drew %d distinct users of 10000, want nearly 100", len(users))
	}
}

func BenchmarkWorkerNext(b *testing.B) {
	for _, s := range []string{"user_id=user-{0..9999}", "id={0..99999999}"} {
		b.Run(s, func(b *testing.B) {
			tmpl, err := ParseTemplate(s)
			if err != nil {
				b.Fatal(err)
			}
			w := newWorker(nil, &Load{Domain: "bench"}, []*Template{tmpl}, 1)
			b.ReportAllocs()
			for b.Loop() {
				w.next()
			}
		})
	}
}
