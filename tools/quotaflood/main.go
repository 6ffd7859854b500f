// Command quotaflood is a misbehaving Rate Limit Quota Service client, for
// measuring what quota clients cost the rest of the service (issue 35):
// it opens streams and reports distinct buckets on each, as fast as the
// service reads them or at a set interval, and prints what it was
// answered.
//
//	go run ./tools/quotaflood -addr 127.0.0.1:8081 -domain web -streams 10 -buckets 10000 -d 20s
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "the service's gRPC address")
	domain := flag.String("domain", "web", "the reports' domain")
	key := flag.String("key", "tenant", "the bucket id's key; values are distinct per stream and bucket")
	streams := flag.Int("streams", 10, "streams to open, on one connection")
	buckets := flag.Int("buckets", 10000, "distinct buckets each stream reports")
	per := flag.Int("per-report", 500, "buckets in each report (64 KiB holds about 2,200 of this tool's, fewer with longer ids)")
	every := flag.Duration("every", 0, "how often each stream reports all its buckets; 0: as fast as the service reads")
	d := flag.Duration("d", 20*time.Second, "how long to flood")
	flag.Parse()
	if err := run(*addr, *domain, *key, *streams, *buckets, *per, *every, *d); err != nil {
		fmt.Fprintln(os.Stderr, "quotaflood:", err)
		os.Exit(1)
	}
}

func run(addr, domain, key string, streams, buckets, per int, every, d time.Duration) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var sent, answered, actions atomic.Int64
	var (
		errOnce  sync.Once
		firstErr error
	)
	fail := func(err error) { errOnce.Do(func() { firstErr = err }) }
	var wg sync.WaitGroup
	for s := range streams {
		wg.Go(func() {
			st, err := rlqsv3.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
			if err != nil {
				fail(err)
				return
			}
			go func() {
				for {
					r, err := st.Recv()
					if err != nil {
						return
					}
					answered.Add(1)
					actions.Add(int64(len(r.GetBucketAction())))
				}
			}()
			reports := chunks(domain, key, s, buckets, per)
			for ctx.Err() == nil {
				start := time.Now()
				for _, m := range reports {
					if err := st.Send(m); err != nil {
						if ctx.Err() == nil {
							fail(err)
						}
						return
					}
					sent.Add(1)
				}
				if every > 0 {
					select {
					case <-ctx.Done():
					case <-time.After(every - time.Since(start)):
					}
				}
			}
		})
	}
	wg.Wait()
	fmt.Printf("reports sent %d (%.0f/s), responses %d, bucket actions %d\n",
		sent.Load(), float64(sent.Load())/d.Seconds(), answered.Load(), actions.Load())
	return firstErr
}

// chunks returns the reports of one stream's buckets, per in each.
func chunks(domain, key string, stream, buckets, per int) []*rlqsv3.RateLimitQuotaUsageReports {
	var out []*rlqsv3.RateLimitQuotaUsageReports
	for start := 0; start < buckets; start += per {
		m := &rlqsv3.RateLimitQuotaUsageReports{Domain: domain}
		for i := start; i < min(buckets, start+per); i++ {
			m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
				BucketId:           &rlqsv3.BucketId{Bucket: map[string]string{key: fmt.Sprintf("s%d-b%d", stream, i)}},
				TimeElapsed:        durationpb.New(time.Second),
				NumRequestsAllowed: 1,
			})
		}
		out = append(out, m)
	}
	return out
}
