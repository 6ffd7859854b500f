package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimit/loadgen"
)

// What Prometheus scrapes cost the decisions (-scrapes, issue 26): the
// service on the memory store with scrapeRules rules, every one hit once so
// that each has its series, then rounds of decisions at 64 in flight with
// 0, 1 and 4 scrapers pulling /metrics in a loop beside them. Each round
// measures every scraper count once, so that the ratios are taken within a
// round.

// scrapeRules is the number of rules, each with its series.
const scrapeRules = 10000

// scrapeRun is one measurement.
type scrapeRun struct {
	scrapers  int
	rps       float64
	p99       time.Duration
	scrapes   int64
	bytes     int64
	scrapeDur time.Duration // mean
	rss       uint64        // the service's, at the end
}

// runScrapeBench is the -scrapes mode.
func runScrapeBench(ctx context.Context, bin, tmp string, runs int, d time.Duration, logf func(string, ...any)) error {
	root := filepath.Join(tmp, "scrape-rules")
	var b strings.Builder
	b.WriteString("domain: scrape\ndescriptors:\n")
	for i := range scrapeRules {
		fmt.Fprintf(&b, "  - key: k%d\n    rate_limit: {unit: hour, requests_per_unit: 1000000000}\n", i)
	}
	if err := writeRules(root, b.String()); err != nil {
		return err
	}
	svc, err := startService(ctx, bin, "ratelimit (scrapes)", root, "BACKEND_TYPE=memory")
	if err != nil {
		return err
	}
	defer svc.stop()
	metrics := strings.Replace(svc.statsURL, "/stats", "/metrics", 1)

	// Every rule once, so that each has its series: 6 per rule.
	for i := range scrapeRules {
		if _, err := loadgen.Run(ctx, svc.grpcAddr, 1, loadgen.Load{Domain: "scrape", Descriptors: []string{fmt.Sprintf("k%d=v", i)}, Concurrency: 1, Requests: 1}); err != nil {
			return err
		}
	}
	logf("benchrun: %d rules hit once each; /metrics %s", scrapeRules, metrics)

	var all []scrapeRun
	for round := range runs {
		for _, n := range []int{0, 1, 4} {
			logf("benchrun: scrapes round %d/%d: %d scraper(s)", round+1, runs, n)
			r, err := measureScrapes(ctx, svc, metrics, n, d)
			if err != nil {
				return err
			}
			all = append(all, r)
		}
	}
	fmt.Fprintf(os.Stdout, "\n| scrapers | decisions/s (median) | × none, per round | p99 | scrapes/s | exposition | mean scrape | service RSS at the end |\n|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	base := map[int]float64{}
	for i, r := range all {
		if r.scrapers == 0 {
			base[i/3] = r.rps
		}
	}
	for _, n := range []int{0, 1, 4} {
		var rps, ratio, p99, perSec, bytes, dur, rss []float64
		for i, r := range all {
			if r.scrapers != n {
				continue
			}
			rps = append(rps, r.rps)
			ratio = append(ratio, r.rps/base[i/3])
			p99 = append(p99, float64(r.p99))
			perSec = append(perSec, float64(r.scrapes)/d.Seconds())
			if r.scrapes > 0 {
				bytes = append(bytes, float64(r.bytes)/float64(r.scrapes))
				dur = append(dur, float64(r.scrapeDur))
			}
			rss = append(rss, float64(r.rss))
		}
		exposition, mean := "–", "–"
		if len(bytes) > 0 {
			exposition = fmt.Sprintf("%.2f MB", median(bytes)/1e6)
			mean = time.Duration(median(dur)).Round(time.Millisecond).String()
		}
		fmt.Fprintf(os.Stdout, "| %d | %s | %.2f (%.2f–%.2f) | %v | %.1f | %s | %s | %.0f MB |\n", n, thousands(median(rps)), median(ratio),
			slices.Min(ratio), slices.Max(ratio), time.Duration(median(p99)).Round(100*time.Microsecond), median(perSec), exposition, mean, median(rss)/1e6)
	}
	return nil
}

// measureScrapes runs decisions for d with n scrapers beside them.
func measureScrapes(ctx context.Context, svc *service, url string, n int, d time.Duration) (scrapeRun, error) {
	r := scrapeRun{scrapers: n}
	sctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var scrapes, bytes, nanos atomic.Int64
	client := &http.Client{Timeout: 30 * time.Second}
	for range n {
		wg.Go(func() {
			for sctx.Err() == nil {
				began := time.Now()
				resp, err := client.Get(url)
				if err != nil {
					continue
				}
				m, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				scrapes.Add(1)
				bytes.Add(m)
				nanos.Add(int64(time.Since(began)))
			}
		})
	}
	res, err := loadgen.Run(ctx, svc.grpcAddr, 4, loadgen.Load{Domain: "scrape", Descriptors: []string{"k{0..9999}=v"}, Concurrency: 64, Duration: d, Warmup: time.Second})
	stop()
	wg.Wait()
	if err != nil {
		return r, err
	}
	r.rps, r.p99 = res.RPS(), res.Latency.P99
	r.scrapes, r.bytes = scrapes.Load(), bytes.Load()
	if r.scrapes > 0 {
		r.scrapeDur = time.Duration(nanos.Load() / r.scrapes)
	}
	r.rss, err = rssBytes(svc.pid())
	return r, err
}
