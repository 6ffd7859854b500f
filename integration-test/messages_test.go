package integration

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// statusKB reads a "kB" field (VmRSS, VmHWM) of /proc/<pid>/status.
func (p *proc) statusKB(t *testing.T, field string) int {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				t.Fatalf("%s: %v", field, err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, p.cmd.Process.Pid)
	return 0
}

// padded returns a valid request of descriptors no rule matches (so the
// store does no work), each with one value of 4000 bytes (the service
// refuses longer ones), padded to size bytes when marshalled.
func padded(t *testing.T, size int) *rlsv3.RateLimitRequest {
	t.Helper()
	r := &rlsv3.RateLimitRequest{Domain: "web"}
	for proto.Size(r) < size {
		r.Descriptors = append(r.Descriptors, &ratelimitv3.RateLimitDescriptor{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "pad", Value: strings.Repeat("p", 4000)}},
		})
	}
	e := r.Descriptors[len(r.Descriptors)-1].Entries[0]
	// Trim the last value; its length prefix may shrink with it.
	e.Value = e.Value[:len(e.Value)-(proto.Size(r)-size)]
	if n := proto.Size(r); n > size || n < size-8 {
		t.Fatalf("padded request is %d bytes, want %d", n, size)
	}
	return r
}

// TestLargeGRPCMessagesKeepMemoryBounded sends, at once, 150 clients'
// messages just under GRPC_MAX_RECV_MSG_SIZE (64 KiB) and 30 clients'
// 4 MiB messages: the small ones are served, the big ones refused with
// ResourceExhausted before they are read whole, and the process's peak RSS
// stays under maxPeakMB. It measures the service built without -race.
func TestLargeGRPCMessagesKeepMemoryBounded(t *testing.T) {
	slow(t)
	busyParallel(t)
	// Measured on 2 loaded cores: a peak of 83 to 124 MB (about 30 MB of
	// live heap: 150 messages in flight, read and decoded, and each
	// connection's buffers; the rest is garbage-collector headroom). With
	// grpc-go's 4 MiB limit the same load peaked at 398 MB, and 150
	// clients of 4 MiB messages at 2 GB.
	const maxPeakMB = 200
	p := launchWith(t, launchOpts{binary: plainBinary(t)}, map[string]string{"web.yaml": webRules})
	p.waitHealth(t, http.StatusOK)
	under, over := padded(t, 64<<10-64), padded(t, 4<<20)
	before := p.statusKB(t, "VmRSS")

	var wg sync.WaitGroup
	var served, refused atomic.Int64
	send := func(r *rlsv3.RateLimitRequest, calls int, big bool) {
		defer wg.Done()
		cc, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Error(err)
			return
		}
		defer cc.Close()
		c := rlsv3.NewRateLimitServiceClient(cc)
		for range calls {
			// Generous: a loaded machine, and 4 MiB to push for each
			// refusal.
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			_, err := c.ShouldRateLimit(ctx, r)
			cancel()
			tooLarge := status.Code(err) == codes.ResourceExhausted && strings.Contains(err.Error(), "larger than max")
			switch {
			case big && tooLarge:
				refused.Add(1)
			case big:
				t.Errorf("a 4 MiB message: %v, want ResourceExhausted (larger than max)", err)
			case err == nil:
				served.Add(1)
			default:
				t.Errorf("a message under the limit: %v", err)
			}
		}
	}
	for range 150 {
		wg.Add(1)
		go send(under, 20, false)
	}
	for range 30 {
		wg.Add(1)
		go send(over, 5, true)
	}
	wg.Wait()
	peak := p.statusKB(t, "VmHWM")
	t.Logf("RSS %d kB before, peak %d kB; %d served, %d refused", before, peak, served.Load(), refused.Load())
	if served.Load() != 150*20 || refused.Load() != 30*5 {
		t.Errorf("%d served and %d refused, want %d and %d", served.Load(), refused.Load(), 150*20, 30*5)
	}
	if peak > maxPeakMB<<10 {
		t.Errorf("peak RSS %d kB, want under %d MB", peak, maxPeakMB)
	}
}
