package main

import (
	"encoding/binary"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
)

// TestH2grpcBody: the body h2load sends is one gRPC message, uncompressed,
// whose length prefix is right and which decodes to the call checkCall
// makes.
func TestH2grpcBody(t *testing.T) {
	b, err := h2grpcBody(1)
	if err != nil {
		t.Fatal(err)
	}
	if b[0] != 0 || int(binary.BigEndian.Uint32(b[1:5])) != len(b)-5 {
		t.Fatalf("prefix % x for a body of %d bytes", b[:5], len(b))
	}
	var req rlsv3.RateLimitRequest
	if err := proto.Unmarshal(b[5:], &req); err != nil {
		t.Fatal(err)
	}
	e := req.GetDescriptors()[0].GetEntries()[0]
	if req.GetDomain() != "bench" || e.GetKey() != "user_id" || e.GetValue() != "user-1" {
		t.Errorf("decoded %v", &req)
	}
}

// TestH2grpcMarkdown: fractions of the no-op server and the ratios to the
// anchor are taken within a round.
func TestH2grpcMarkdown(t *testing.T) {
	noop := &h2grpcTarget{name: "no-op"}
	ours := &h2grpcTarget{name: "this service", store: "redis"}
	wb := &h2grpcTarget{name: "this service", variant: "write-behind 100ms", store: "redis"}
	anchor := &h2grpcTarget{name: anchorVariant, store: "redis"}
	results := map[*h2grpcTarget][]h2grpcRun{
		noop:   {{reqPerSec: 100000, rls: 10, ops: -1}, {reqPerSec: 50000, rls: 10, ops: -1}},
		ours:   {{reqPerSec: 60000, rls: 20, store: 5, ops: 1}, {reqPerSec: 30000, rls: 20, store: 5, ops: 1}},
		wb:     {{reqPerSec: 90000, rls: 12, store: 1, ops: 0.0004}, {reqPerSec: 45000, rls: 12, store: 1, ops: 0.0002}},
		anchor: {{reqPerSec: 20000, rls: 70, store: 5, ops: -1}, {reqPerSec: 10000, rls: 70, store: 5, bad: 2, ops: -1}},
	}
	md := h2grpcMarkdown(h2grpcOptions{runs: 2, duration: time.Second, conns: 16, stream: 4}, []*h2grpcTarget{noop, ours, wb, anchor}, results)
	for _, want := range []string{
		"| this service | redis | 45000 | 60% | 20.0 | 5.0 | 1 | 0 |",
		"| this service, write-behind 100ms | redis | 67500 | 90% | 12.0 | 1.0 | 0.0003 | 0 |",
		"| envoyproxy/ratelimit | redis | 15000 | 20% | 70.0 | 5.0 | – | 2 |",
		"| redis | 3.00× (3.00–3.00) | 3.50× (3.50–3.50) |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("table lacks %q:\n%s", want, md)
		}
	}
	if strings.Count(md, "\n| redis | ") != 1 {
		t.Errorf("the write-behind row was compared with the anchor:\n%s", md)
	}
}
