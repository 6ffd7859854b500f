package server

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimit/harness"
)

const quotaServerRules = serverRules + `quota_buckets:
  - bucket: {tenant: "*"}
    rate_limit: {unit: second, requests_per_unit: 10}
`

// quotaStream opens an RLQS stream over cc and sends one report of a new
// bucket, as Envoy does at a bucket's first request.
func quotaStream(t *testing.T, cc *grpc.ClientConn) rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	s, err := rlqsv3.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "web", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId:           &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "acme"}},
		TimeElapsed:        &durationpb.Duration{},
		NumRequestsAllowed: 1,
	}}})
	// io.EOF: the server ended the stream already (Unimplemented, say);
	// its status comes with the next Recv.
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return s
}

// tokens returns the tokens a second of the first assignment r carries.
func tokens(r *rlqsv3.RateLimitQuotaResponse) float64 {
	tb := r.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	return float64(tb.GetTokensPerFill().GetValue()) / float64(tb.GetFillInterval().GetSeconds())
}

func TestRLQSOnTheGRPCListener(t *testing.T) {
	srv, _ := start(t, quotaServerRules, map[string]string{"RLQS_ASSIGNMENT_TTL": "7s"})
	cc := dial(t, srv)
	r, err := quotaStream(t, cc).Recv()
	if err != nil {
		t.Fatal(err)
	}
	a := r.GetBucketAction()
	if len(a) != 1 || a[0].GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration() != 7*time.Second {
		t.Fatalf("response %v, want one assignment with RLQS_ASSIGNMENT_TTL", r)
	}
	// A new bucket after the start held nothing (a cold start): alone,
	// it gets all of 10/s but the reserve (5 %).
	if got := tokens(r); got != 9.5 {
		t.Errorf("first share after the start = %v/s, want 9.5/s", got)
	}
	if got := srv.stats.Gauges()["ratelimit.rlqs.streams"]; got != 1 {
		t.Errorf("ratelimit.rlqs.streams = %d, want 1", got)
	}
	// The live view's API shows the stream's subscription.
	code, body := get(t, "http://"+srv.Addrs().Debug.String()+"/api/v1/quota")
	if code != 200 || !strings.Contains(body, `"streams":1`) || !strings.Contains(body, `"subscribers":1`) || !strings.Contains(body, `"tenant":"acme"`) {
		t.Errorf("/api/v1/quota = %d %s, want the stream and its bucket", code, body)
	}
	// The quota statistics, as Prometheus reads them.
	code, body = get(t, "http://"+srv.Addrs().Debug.String()+"/metrics")
	for _, want := range []string{
		`ratelimit_rlqs_streams 1`, `ratelimit_rlqs_subscriptions 1`, `ratelimit_rlqs_reports 1`,
		`ratelimit_rlqs_rule_allowed{domain="web",rule="quota_buckets[1]"} 1`,
		`ratelimit_rlqs_rule_beyond_share{domain="web",rule="quota_buckets[1]"} 1`,
	} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
	// /rlconfig lists the quota rule.
	if code, body := get(t, "http://"+srv.Addrs().Debug.String()+"/rlconfig"); code != 200 || !strings.Contains(body, "web quota_buckets[1] {tenant=*}: unit=SECOND requests_per_unit=10") {
		t.Errorf("/rlconfig = %d:\n%s\nwant the quota rule", code, body)
	}
}

func TestRLQSEnabled(t *testing.T) {
	tests := []struct {
		name    string
		enabled string
		rules   string
		want    codes.Code
	}{
		{"auto_with_quota_rules", "", quotaServerRules, codes.OK},
		{"auto_without", "", serverRules, codes.Unimplemented},
		{"on_without", "true", serverRules, codes.OK},
		{"off", "false", quotaServerRules, codes.Unimplemented},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _ := start(t, tt.rules, map[string]string{"RLQS_ENABLED": tt.enabled})
			s := quotaStream(t, dial(t, srv))
			if tt.want == codes.OK {
				// A bucket without a rule is not answered; the stream
				// stays open until the client closes it.
				if err := s.CloseSend(); err != nil {
					t.Fatal(err)
				}
				if _, err := s.Recv(); tt.rules == serverRules && !errors.Is(err, io.EOF) {
					t.Errorf("stream with no quota rules: %v, want its end with no answer", err)
				} else if tt.rules != serverRules && err != nil {
					t.Errorf("Recv: %v, want an assignment", err)
				}
				return
			}
			if _, err := s.Recv(); status.Code(err) != tt.want {
				t.Errorf("stream: %v, want %v", err, tt.want)
			}
		})
	}
}

// TestRLQSShutdown: quota streams never end by themselves; a shutdown
// ends them at once with Unavailable (Envoy keeps its assignments until
// their TTL and reconnects), well within the drain.
func TestRLQSShutdown(t *testing.T) {
	srv, _, stop := startStoppable(t, quotaServerRules, nil)
	s := quotaStream(t, dial(t, srv))
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	if _, err := s.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("stream at shutdown: %v, want Unavailable", err)
	}
	select {
	case <-stopped:
	case <-time.After(shutdownDrain):
		t.Fatalf("Run still running %v after the shutdown began, with a quota stream open", shutdownDrain)
	}
	if d := time.Since(began); d > shutdownDrain/2 {
		t.Errorf("shutdown took %v with a quota stream open; it should not wait for the stream", d)
	}
}

// TestRLQSOverMTLS: the quota service shares the listener's mTLS.
func TestRLQSOverMTLS(t *testing.T) {
	serverCA, clientCA, otherCA := harness.NewCA(t, "server CA"), harness.NewCA(t, "client CA"), harness.NewCA(t, "other CA")
	sec := harness.NewSecretDir(t, secretFiles(serverCA.Server(t), clientCA))
	srv, _ := start(t, quotaServerRules, tlsEnv(sec, true, ""))
	good := dialWith(t, srv, credentials.NewTLS(harness.ClientConfig(clientCA.Client(t, "envoy"), serverCA)))
	awaitServing(t, good)
	if _, err := quotaStream(t, good).Recv(); err != nil {
		t.Errorf("RLQS with a client certificate of the client CA: %v", err)
	}
	bad := dialWith(t, srv, credentials.NewTLS(harness.ClientConfig(otherCA.Client(t, "envoy"), serverCA)))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s, err := rlqsv3.NewRateLimitQuotaServiceClient(bad).StreamRateLimitQuotas(ctx)
	if err == nil {
		_, err = s.Recv()
	}
	if status.Code(err) != codes.Unavailable {
		t.Errorf("RLQS with a certificate of another CA: %v, want the connection refused (Unavailable)", err)
	}
}

// TestRLQSReportSize: a report larger than GRPC_MAX_RECV_MSG_SIZE ends
// its stream with ResourceExhausted before it is read whole.
func TestRLQSReportSize(t *testing.T) {
	srv, _ := start(t, quotaServerRules, map[string]string{"GRPC_MAX_RECV_MSG_SIZE": "1024"})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	s, err := rlqsv3.NewRateLimitQuotaServiceClient(dial(t, srv)).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "web"}
	for i := range 100 {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": strings.Repeat("t", 10) + string(rune('a'+i%26))}},
		})
	}
	if err := s.Send(m); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("report of %d bytes with GRPC_MAX_RECV_MSG_SIZE=1024: %v, want ResourceExhausted", proto.Size(m), err)
	}
}

// TestRLQSSharedThroughRedis: with BACKEND_TYPE=redis the quota service's
// pools are shared by the replicas on that Redis: one of them owns the
// bucket's pool, and the second server's first grant counts the first's.
// The shared pools are new and their buckets too (a cold start): the
// first gets all of 10/s but the reserve, the second only what the first
// leaves, where a replica of its own would give it the same again.
func TestRLQSSharedThroughRedis(t *testing.T) {
	redisSrv := harness.StartRedis(t, harness.RedisOptions{})
	env := map[string]string{"BACKEND_TYPE": "redis", "REDIS_URL": redisSrv.Addr, "REDIS_SOCKET_TYPE": "tcp"}
	var logs syncBuffer
	a, _ := build(t, quotaServerRules, env, &logs)
	run(t, a)
	b, _ := start(t, quotaServerRules, env)
	if strings.Contains(logs.String(), oneReplica) {
		t.Errorf("log with BACKEND_TYPE=redis says %q:\n%s", oneReplica, logs.String())
	}
	sa := quotaStream(t, dial(t, a))
	ra, err := sa.Recv()
	if err != nil {
		t.Fatal(err)
	}
	rb, err := quotaStream(t, dial(t, b)).Recv()
	if err != nil {
		t.Fatal(err)
	}
	ga, gb := tokens(ra), tokens(rb)
	if ga < 9.5 {
		t.Errorf("a's first grant = %v a second, want at least 9.5", ga)
	}
	if gb > 10-ga+1e-9 {
		// b's first grant does not fit beside a's: it may come after the
		// pool made room, when a slow machine delayed it (a replica that
		// stalls for 3 s is taken for dead, its pool taken over), and
		// then a was sent the decrease before it (after an increase or
		// two, at most): one that never came fails the stream's Recv.
		fits := false
		for i := 0; i < 4 && !fits && err == nil; i++ {
			if ra, err = sa.Recv(); err == nil {
				fits = tokens(ra)+gb <= 10+1e-9
			}
		}
		if !fits {
			t.Errorf("first grants = %v and %v a second, and no later grant of a's fits beside b's within 10 (%v)", ga, gb, err)
		}
	}
	// A replica that stalled and lost its lease still says it owns the
	// pool until its next exchange: its writes are refused meanwhile.
	harness.WaitFor(t, 15*time.Second, "one owner", func() bool {
		return a.stats.Gauges()["ratelimit.rlqs.shared.owned"]+b.stats.Gauges()["ratelimit.rlqs.shared.owned"] == 1
	})
}

// oneReplica begins the line a server logs when its quota service's
// shares live in its own memory.
const oneReplica = "quota service: one replica"

// TestRLQSMemoryStoreSaysOneReplica: with the memory store the quota
// service's shares live in this process, so several replicas would each
// give out the whole limit; its log says to run it on one replica, once
// the rules have quota buckets (and not before: most users of the memory
// store do not use quotas).
func TestRLQSMemoryStoreSaysOneReplica(t *testing.T) {
	var logs, noQuota syncBuffer
	srv, _ := build(t, quotaServerRules, map[string]string{"BACKEND_TYPE": "memory"}, &logs)
	run(t, srv)
	if got := strings.Count(logs.String(), oneReplica); got != 1 {
		t.Errorf("log with BACKEND_TYPE=memory says %q %d times, want once:\n%s", oneReplica, got, logs.String())
	}
	srv, _ = build(t, serverRules, map[string]string{"BACKEND_TYPE": "memory"}, &noQuota)
	run(t, srv)
	if strings.Contains(noQuota.String(), oneReplica) {
		t.Errorf("log with no quota_buckets says %q:\n%s", oneReplica, noQuota.String())
	}
}
