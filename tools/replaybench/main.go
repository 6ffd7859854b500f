// Command replaybench measures ratelimit-check -replay: it makes a capture
// of synthetic traffic (an hour at 10,000 requests a second by default,
// written on the fly through a pipe, so that the 4 GB it would take on
// disk never exist), replays it against a stricter set of rules and the
// current one, as `ratelimit-check -replay CAPTURE -config_dir NEW
// -against OLD` does, and prints how long that took, the rate, and the
// heap's peak. docs/BENCHMARKS.md ("Replay") has its figures.
//
//	go run ./tools/replaybench                      # an hour at 10,000/s
//	go run ./tools/replaybench -seconds 60          # a minute of it
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"time"

	"github.com/ratelimitd/ratelimit/src/capture"
	"github.com/ratelimitd/ratelimit/src/replay"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// current and stricter are the rules replayed: an address limit, a user
// limit with a sustained one beside it, and a path rule; the stricter set
// halves the user's per-minute limit and adds a shadow limit.
const (
	current = `domain: web
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 60}
      - {unit: hour, requests_per_unit: 1000, algorithm: sliding_window, name: sustained}
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: token_bucket}
`
	stricter = `domain: web
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 30}
      - {unit: hour, requests_per_unit: 1000, algorithm: sliding_window, name: sustained}
      - {unit: minute, requests_per_unit: 20, shadow_mode: true, name: tried}
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: token_bucket}
`
)

func main() {
	rate := flag.Int("rate", 10_000, "requests a second")
	seconds := flag.Int("seconds", 3600, "seconds of traffic")
	users := flag.Int("users", 50_000, "distinct users (and a tenth as many addresses)")
	write := flag.String("write", "", "write the capture and the two rule sets (FILE, FILE.current/, FILE.stricter/) instead of replaying")
	one := flag.Bool("one", false, "replay against the stricter rules only, compared with the answers in the capture (as without -against)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the replay to this file")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "replaybench:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if *write != "" {
		if err := writeFiles(*write, *rate, *seconds, *users); err != nil {
			fmt.Fprintln(os.Stderr, "replaybench:", err)
			os.Exit(1)
		}
		return
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400) // as ratelimit-check -replay
	}
	if err := run(*rate, *seconds, *users, *one); err != nil {
		fmt.Fprintln(os.Stderr, "replaybench:", err)
		os.Exit(1)
	}
}

func run(rate, seconds, users int, one bool) error {
	parse := func(yaml string) (*rules.Config, error) {
		return rules.Parse([]rules.File{{Name: "web.yaml", Data: []byte(yaml)}}, rules.Options{})
	}
	newRules, err := parse(stricter)
	if err != nil {
		return err
	}
	oldRules, err := parse(current)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(generate(pw, rate, seconds, users)) }()
	rd, err := capture.NewReader(pr)
	if err != nil {
		return err
	}
	var peak uint64
	stop := make(chan struct{})
	go func() {
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
				metrics.Read(s)
				peak = max(peak, s[0].Value.Uint64())
			}
		}
	}()
	start := time.Now()
	cfg := replay.Config{New: newRules, NewName: "stricter", Old: oldRules, OldName: "current"}
	sets := "two rule sets"
	if one {
		cfg.Old, sets = nil, "one rule set"
	}
	rep, err := replay.Run(context.Background(), rd, cfg)
	took := time.Since(start)
	close(stop)
	if err != nil {
		return err
	}
	fmt.Printf("replayed %d requests (%d s at %d/s, %d users) against %s in %s: %.0f requests/s, heap peak %d MiB\n",
		rep.Requests, seconds, rate, users, sets, took.Round(time.Millisecond), float64(rep.Requests)/took.Seconds(), peak>>20)
	fmt.Printf("%d descriptors answered differently; %d requests refused by the stricter rules only\n", rep.DescriptorsDiffer, rep.RefusedByNewOnly)
	return nil
}

// generate writes a capture of seconds × rate requests, evenly spaced:
// each the address of one of users/10 clients, and its user, and one in
// ten the login path, users drawn with a skew (a few users make much of
// the traffic).
func generate(w io.Writer, rate, seconds, users int) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	start := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	h := fmt.Sprintf(`{"capture":1,"ns":%d,"values":"plain","seconds":%d,"requests":%d}`+"\n", start.UnixNano(), seconds, rate*seconds)
	if _, err := bw.WriteString(h); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	zipf := rand.NewZipf(rng, 1.2, 1, uint64(users-1))
	step := time.Second / time.Duration(rate)
	var line []byte
	req := capture.Request{Domain: "web", Codes: make([]bool, 3)}
	userVals := make([]string, users)
	for i := range userVals {
		userVals[i] = "user-" + strconv.Itoa(i)
	}
	for i := range rate * seconds {
		u := int(zipf.Uint64())
		req.Time = start.Add(time.Duration(i) * step)
		req.Descriptors = req.Descriptors[:0]
		req.Descriptors = append(req.Descriptors,
			capture.Descriptor{Entries: []rules.Entry{{Key: "remote_address", Value: "10.0." + strconv.Itoa(u%(users/10+1)/256) + "." + strconv.Itoa(u%(users/10+1)%256)}}},
			capture.Descriptor{Entries: []rules.Entry{{Key: "user", Value: userVals[u]}}})
		if i%10 == 0 {
			req.Descriptors = append(req.Descriptors, capture.Descriptor{Entries: []rules.Entry{{Key: "path", Value: "/login"}}})
		}
		req.Codes = req.Codes[:len(req.Descriptors)]
		line = capture.AppendRequest(line[:0], &req, nil)
		if _, err := bw.Write(line); err != nil {
			return err
		}
	}
	end := start.Add(time.Duration(seconds) * time.Second).UnixNano()
	if _, err := fmt.Fprintf(bw, `{"summary":{"ns":%d,"requests":%d,"dropped":0,"too_large":0,"bytes":0,"reason":"seconds"}}`+"\n", end, rate*seconds); err != nil {
		return err
	}
	return bw.Flush()
}

// writeFiles writes the capture to file and the rule sets beside it, for
// ratelimit-check -replay FILE -config_dir FILE.stricter -against FILE.current.
func writeFiles(file string, rate, seconds, users int) error {
	for dir, yaml := range map[string]string{file + ".current": current, file + ".stricter": stricter} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(dir+"/web.yaml", []byte(yaml), 0o644); err != nil {
			return err
		}
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if err := generate(f, rate, seconds, users); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
