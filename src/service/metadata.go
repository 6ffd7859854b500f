package service

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// dynamicMetadata builds the response's dynamic_metadata
// (RESPONSE_DYNAMIC_METADATA), as envoyproxy/ratelimit does: the domain,
// each descriptor's "key=value" entries (and its own hitsAddend when set),
// the request's hitsAddend when set, and under "metadata" the rule
// metadata of every descriptor within its limit, merged
// (the first value wins; nested maps merge); and "degraded": true when the
// decision came from this instance's local counts (STORE_FAILURE_MODE=
// local), and "shadowOverLimit": the names of the shadow limits that would
// have refused the request, keys the anchor does not have. Envoy stores it
// under the filter's namespace, where routing and access logs read it.
func dynamicMetadata(req *rlsv3.RateLimitRequest, passed []map[string]any, m marks) (*structpb.Struct, error) {
	descs := make([]any, 0, len(req.GetDescriptors()))
	for _, d := range req.GetDescriptors() {
		entries := make([]any, 0, len(d.GetEntries()))
		for _, e := range d.GetEntries() {
			entries = append(entries, e.GetKey()+"="+e.GetValue())
		}
		desc := map[string]any{"entries": entries}
		if h := d.GetHitsAddend(); h != nil {
			desc["hitsAddend"] = float64(h.GetValue())
		}
		descs = append(descs, desc)
	}
	fields := map[string]any{
		"domain":      req.GetDomain(),
		"descriptors": descs,
	}
	if h := req.GetHitsAddend(); h > 0 {
		fields["hitsAddend"] = float64(h)
	}
	if m.degraded {
		fields["degraded"] = true
	}
	if m.shadowOver != nil {
		fields["shadowOverLimit"] = m.shadowOver
	}
	if len(passed) > 0 {
		merged := map[string]any{}
		for _, md := range passed {
			mergeInto(merged, md)
		}
		fields["metadata"] = merged
	}
	return structpb.NewStruct(fields)
}

// marks are what a response's dynamic metadata says even without
// RESPONSE_DYNAMIC_METADATA: the decision came from local counts
// (STORE_FAILURE_MODE=local), and the names of the shadow limits that
// would have refused the request (strings, as structpb takes them).
type marks struct {
	degraded   bool
	shadowOver []any
}

// markMetadata is the dynamic metadata of a decision while
// RESPONSE_DYNAMIC_METADATA is off: {"degraded": true} and
// {"shadowOverLimit": [names]}, whichever apply.
func markMetadata(m marks) *structpb.Struct {
	md := &structpb.Struct{Fields: make(map[string]*structpb.Value, 2)}
	if m.degraded {
		md.Fields["degraded"] = structpb.NewBoolValue(true)
	}
	if m.shadowOver != nil {
		names := make([]*structpb.Value, len(m.shadowOver))
		for i, n := range m.shadowOver {
			names[i] = structpb.NewStringValue(n.(string))
		}
		md.Fields["shadowOverLimit"] = structpb.NewListValue(&structpb.ListValue{Values: names})
	}
	return md
}

// mergeInto copies src into dst; a key already in dst keeps its value,
// except that two maps under the same key are merged.
func mergeInto(dst, src map[string]any) {
	for k, v := range src {
		old, ok := dst[k]
		if !ok {
			dst[k] = v
			continue
		}
		om, ok1 := old.(map[string]any)
		nm, ok2 := v.(map[string]any)
		if ok1 && ok2 {
			cp := make(map[string]any, len(om))
			mergeInto(cp, om)
			mergeInto(cp, nm)
			dst[k] = cp
		}
	}
}
