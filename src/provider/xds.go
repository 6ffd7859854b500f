package provider

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	cbackoff "github.com/cenkalti/backoff/v5"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// RateLimitConfigType is the type URL of the xDS resources that carry
// rules: go-control-plane's ratelimit.config.ratelimit.v3.RateLimitConfig,
// the type envoyproxy/ratelimit subscribes to.
const RateLimitConfigType = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// maxErrorDetail bounds the message of a NACK: the server logs it, and a
// snapshot with thousands of problems would otherwise send them all back.
const maxErrorDetail = 4096

// ErrXDSConnection is reported (wrapped) when a connection to the xDS
// server cannot be made or ends. It says nothing about the rules: those
// in use stay, and the watcher connects again after the back-off.
var ErrXDSConnection = errors.New("xds connection")

// ErrXDSTooLarge is reported (wrapped) when the server sends an update
// larger than XDSConfig.MaxMessageBytes: a refused update, reported once
// however often it is fetched again. gRPC ends the stream on it, so the
// watcher connects again after the back-off, which the next such update
// does not reset.
var ErrXDSTooLarge = errors.New("update over XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")

// XDSConfig says which xDS management server to take the rules from, and
// how. The rules are RateLimitConfig resources, one per domain, received
// state of the world over the aggregated discovery service (ADS), as
// envoyproxy/ratelimit receives them.
type XDSConfig struct {
	// ServerURL is the server: host:port, or any gRPC target such as
	// dns:///host:port (CONFIG_GRPC_XDS_SERVER_URL).
	ServerURL string
	// NodeID is this client's node id (CONFIG_GRPC_XDS_NODE_ID): the key
	// under which a snapshot cache holds its rules.
	NodeID string
	// NodeMetadata is sent as the node's metadata, each value a string
	// (CONFIG_GRPC_XDS_NODE_METADATA).
	NodeMetadata map[string]string
	// Headers are sent as gRPC metadata on every stream
	// (CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS), for servers that want
	// a token. Their values never appear in errors.
	Headers map[string]string
	// TLS secures the connection when not nil; nil is plaintext.
	TLS *XDSTLS
	// Backoff is the wait between connection attempts. A server that
	// sends again an update it was refused gets the NACK again after a
	// wait that starts at 1s (or Backoff.Initial if shorter) and doubles
	// up to Backoff.Initial: the pair does not spin, and a fixed snapshot
	// is taken within Backoff.Initial.
	Backoff Backoff
	// MaxMessageBytes bounds one message from the server
	// (XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES); 0 is gRPC's default, 4 MiB. A
	// larger message ends the connection, as any broken one, and the
	// rules in use stay.
	MaxMessageBytes int
	// Options is passed to rules.Build.
	Options rules.Options
	// Now is the clock for XDSStats; nil means time.Now.
	Now func() time.Time
}

// XDSTLS is the TLS of the connection to the xDS server. The files are
// read at every connection attempt, so renewed certificates are used
// without a restart.
type XDSTLS struct {
	// CertFile and KeyFile are the client certificate and its key, for
	// servers that ask for one (CONFIG_GRPC_XDS_CLIENT_TLS_CERT, _KEY).
	// Both or neither.
	CertFile, KeyFile string
	// CAFile holds the certificates the server's must chain to
	// (CONFIG_GRPC_XDS_SERVER_TLS_CACERT); empty means the system's.
	CAFile string
	// ServerName is the name the server's certificate must hold
	// (CONFIG_GRPC_XDS_SERVER_TLS_SAN); empty means the host of ServerURL.
	ServerName string
}

// Backoff is a wait that starts at Initial, doubles after each failure up
// to Max, and is reset by a success. With Jitter, each wait is spread by up
// to RandomFactor (0..1) of itself, still never beyond Max, so that clients
// that lost one server together do not come back together.
type Backoff struct {
	// Initial is the first wait; 0 means 10s.
	Initial time.Duration
	// Max bounds the waits; below Initial it is Initial.
	Max          time.Duration
	RandomFactor float64
	Jitter       bool
}

// backoff is the state of one Backoff schedule: cenkalti/backoff's
// exponential schedule (the one the binary already carries through the
// OTLP exporter), doubling, with the jitter clamped to Max.
type backoff struct {
	exp cbackoff.ExponentialBackOff
	max time.Duration
}

func newBackoff(cfg Backoff) *backoff {
	cfg = cfg.normal()
	b := &backoff{max: cfg.Max, exp: cbackoff.ExponentialBackOff{
		InitialInterval: cfg.Initial,
		Multiplier:      2,
		MaxInterval:     cfg.Max,
	}}
	if cfg.Jitter {
		b.exp.RandomizationFactor = cfg.RandomFactor
	}
	b.exp.Reset()
	return b
}

// normal returns cfg with its defaults and bounds applied.
func (cfg Backoff) normal() Backoff {
	cfg.Initial = cmp.Or(max(cfg.Initial, 0), 10*time.Second)
	cfg.Max = max(cfg.Max, cfg.Initial)
	cfg.RandomFactor = min(max(cfg.RandomFactor, 0), 1)
	return cfg
}

// repeatBackoff is the schedule of the NACKs answering a server that
// repeats a refused update (see XDSConfig.Backoff).
func repeatBackoff(cfg Backoff) *backoff {
	cfg = cfg.normal()
	cfg.Initial, cfg.Max = min(time.Second, cfg.Initial), cfg.Initial
	return newBackoff(cfg)
}

// wait returns the next wait and doubles the one after.
func (b *backoff) wait() time.Duration { return min(b.exp.NextBackOff(), b.max) }

func (b *backoff) reset() { b.exp.Reset() }

// XDSStats counts what an XDSWatcher did.
type XDSStats struct {
	// Attempts counts the connection attempts, the first one included;
	// Connects those that opened a stream to the server.
	Attempts, Connects uint64
	// Connected is whether a stream is open now.
	Connected bool
	// Loads counts the updates applied; Failures the updates refused
	// (NACKed). An update the server sends again after it was refused is
	// counted once; one that refuses some domains and not others counts
	// in both.
	Loads, Failures uint64
	// Version is the version_info of the last update applied whole.
	Version string
	// LastLoad is when the last update was applied.
	LastLoad time.Time
	// LastError is the last error: a refused update or a failed
	// connection; nil after an update is applied.
	LastError error
}

// XDSWatcher subscribes to the rules of an xDS management server and
// reports each update as a whole validated rules.Config, or the reason it
// was refused, through the callbacks given to WatchXDS. An applied update
// is ACKed; a refused one is NACKed with the reason in error_detail and
// the rules in use stay. An update that refuses some domains and not
// others is both: the others are applied beside the rules in force of the
// refused ones (onLoad), then the refusal is reported (onError) and
// NACKed, naming the domains refused. A broken connection is reported as
// ErrXDSConnection and made again after the back-off; the rules in use
// stay meanwhile.
//
// Its goroutine is owned by the XDSWatcher: it stops when the context
// given to WatchXDS is done or when Close is called, and Close waits for
// it. The methods are safe for concurrent use.
type XDSWatcher struct {
	cfg     XDSConfig
	node    *corev3.Node
	onLoad  func(Snapshot)
	onError func(error)
	cancel  context.CancelFunc
	done    chan struct{}

	// The fields below are the protocol's state: only the run goroutine
	// touches them. version is the version_info of the last update
	// applied whole; applied is the hash of its resources, while its rules
	// are the ones in force (hasApplied).
	version    string
	applied    [sha256.Size]byte
	hasApplied bool
	// inForce is the rules in force, by domain: what an update that
	// refuses a domain keeps of it.
	inForce map[string]domainRules
	// refused are the last updates refused since one was applied (at
	// most maxRefused, oldest first), with why: a server that alternates
	// between invalid updates is answered as one that repeats one.
	refused []refusal
	// refusing is whether the last update handled was refused: a refusal
	// that follows a refusal waits (repeatBackoff) before its NACK,
	// whatever it holds, so that no server and this client spin.
	refusing bool
	// tooLarge is whether an update over the size bound was reported
	// since one was applied: fetched again at each reconnection (its
	// version and nonce may differ), it is reported once.
	tooLarge bool

	// mu guards stats.
	mu    sync.Mutex
	stats XDSStats
}

// WatchXDS connects to the xDS server in the background and reports every
// update through onLoad or onError until ctx is done or Close is called.
// Callbacks run one at a time, from the watcher's goroutine; they must not
// block for long. Keeping the previous config when an update is refused
// is the caller's job, as with Watch.
//
// WatchXDS returns at once, before the first rules arrive; it fails only
// when the configuration cannot work at all (no server, TLS files that
// cannot be read).
func WatchXDS(ctx context.Context, cfg XDSConfig, onLoad func(Snapshot), onError func(error)) (*XDSWatcher, error) {
	if cfg.ServerURL == "" {
		return nil, errors.New("provider: xds: no server URL")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if onLoad == nil {
		onLoad = func(Snapshot) {}
	}
	if onError == nil {
		onError = func(error) {}
	}
	if cfg.TLS != nil {
		// Read the files once now: a path that is wrong from the start
		// is a configuration error, better refused at startup than
		// retried forever.
		if _, err := cfg.TLS.config(); err != nil {
			return nil, err
		}
	}
	node := &corev3.Node{Id: cfg.NodeID}
	if len(cfg.NodeMetadata) > 0 {
		fields := make(map[string]*structpb.Value, len(cfg.NodeMetadata))
		for k, v := range cfg.NodeMetadata {
			fields[k] = structpb.NewStringValue(v)
		}
		node.Metadata = &structpb.Struct{Fields: fields}
	}
	w := &XDSWatcher{cfg: cfg, node: node, onLoad: onLoad, onError: onError, done: make(chan struct{})}
	ctx, w.cancel = context.WithCancel(ctx)
	go w.run(ctx)
	return w, nil
}

// Close stops the watcher, closing its connection, and waits for its
// goroutine to end. No callback runs after Close returns. Close may be
// called more than once.
func (w *XDSWatcher) Close() error {
	w.cancel()
	<-w.done
	return nil
}

// Wait blocks until the watcher has stopped, by Close or by the end of
// the context given to WatchXDS.
func (w *XDSWatcher) Wait() { <-w.done }

// Done is closed when the watcher has stopped.
func (w *XDSWatcher) Done() <-chan struct{} { return w.done }

// Stats returns what the watcher did so far.
func (w *XDSWatcher) Stats() XDSStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stats
}

func (w *XDSWatcher) run(ctx context.Context) {
	defer close(w.done)
	reconnect := newBackoff(w.cfg.Backoff)
	for {
		answered, err := w.session(ctx)
		w.mu.Lock()
		w.stats.Connected = false
		w.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		if st := status.Convert(err); st.Code() == codes.ResourceExhausted && strings.Contains(st.Message(), "larger than max") {
			// gRPC refused a message over MaxMessageBytes: an update
			// refused for its size, which the server sends again at
			// each connection. Reported once, and backed off from.
			err = fmt.Errorf("provider: xds server %s: %w: %s; keeping the rules in use", w.cfg.ServerURL, ErrXDSTooLarge, st.Message())
			w.mu.Lock()
			w.stats.LastError = err
			if !w.tooLarge {
				w.stats.Failures++
			}
			w.mu.Unlock()
			if !w.tooLarge {
				w.tooLarge = true
				w.onError(err)
			}
			if !sleep(ctx, reconnect.wait()) {
				return
			}
			continue
		}
		// A connection that carried an update was a good one: the next
		// failure starts the schedule again. One that never did, such as
		// a server that accepts and hangs up, keeps backing off.
		if answered {
			reconnect.reset()
		}
		err = fmt.Errorf("provider: xds server %s: %w: %w", w.cfg.ServerURL, ErrXDSConnection, err)
		w.mu.Lock()
		w.stats.LastError = err
		w.mu.Unlock()
		w.onError(err)
		if !sleep(ctx, reconnect.wait()) {
			return
		}
	}
}

// sleep waits for d or the end of ctx, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// session makes one connection, subscribes and handles updates until the
// stream ends. It reports whether the server sent any update.
func (w *XDSWatcher) session(ctx context.Context) (answered bool, err error) {
	w.mu.Lock()
	w.stats.Attempts++
	w.mu.Unlock()

	creds := insecure.NewCredentials()
	if w.cfg.TLS != nil {
		c, err := w.cfg.TLS.config()
		if err != nil {
			return false, err
		}
		creds = credentials.NewTLS(c)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if w.cfg.MaxMessageBytes > 0 {
		opts = append(opts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(w.cfg.MaxMessageBytes)))
	}
	// A connection of its own per attempt, so that the waits between
	// attempts are ours (XDS_CLIENT_BACKOFF_*) and not those of a channel
	// reconnecting by itself in the background.
	cc, err := grpc.NewClient(w.cfg.ServerURL, opts...)
	if err != nil {
		return false, err
	}
	defer cc.Close()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(w.cfg.Headers) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, metadata.New(w.cfg.Headers))
	}
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		return false, err
	}
	// Say which version is applied already, so that a server that still
	// has it sends nothing new after a reconnection.
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: w.node, TypeUrl: RateLimitConfigType, VersionInfo: w.version}); err != nil {
		return false, recvError(stream, err)
	}
	w.mu.Lock()
	w.stats.Connects++
	w.stats.Connected = true
	w.mu.Unlock()

	repeat := repeatBackoff(w.cfg.Backoff)
	for {
		resp, err := stream.Recv()
		if err != nil {
			return answered, err
		}
		answered = true
		req := w.handle(ctx, resp, repeat)
		if req == nil {
			continue
		}
		if err := stream.Send(req); err != nil {
			return answered, recvError(stream, err)
		}
	}
}

// recvError returns the error that ended a stream on which Send failed:
// Send only says io.EOF, Recv says why.
func recvError(stream grpc.ClientStream, sendErr error) error {
	if err := stream.RecvMsg(new(discoveryv3.DiscoveryResponse)); err != nil {
		return err
	}
	return sendErr
}

// handle applies or refuses one update and returns the ACK or NACK to
// send, or nil when there is nothing to answer.
func (w *XDSWatcher) handle(ctx context.Context, resp *discoveryv3.DiscoveryResponse, repeat *backoff) *discoveryv3.DiscoveryRequest {
	if resp.GetTypeUrl() != RateLimitConfigType {
		// Only this type is subscribed to; a server that sends others
		// gets no answer for them, as they ask nothing of us.
		return nil
	}
	sum := hashResources(resp.GetResources())
	if w.hasApplied && sum == w.applied {
		// The rules in use, sent again (a reconnection, a new version
		// of the same snapshot): nothing to load.
		repeat.reset()
		w.refusing = false
		w.version = resp.GetVersionInfo()
		w.mu.Lock()
		w.stats.Version = w.version
		w.mu.Unlock()
		return w.ack(resp)
	}
	why, known := w.refusedBefore(sum)
	if !known {
		cfg, domains, refused, err := w.build(resp.GetResources())
		switch {
		case err == nil:
			w.apply(resp, sum, cfg, domains, nil)
			repeat.reset()
			return w.ack(resp)
		case cfg != nil && changes(w.inForce, domains):
			// Some domains refused, the others change the rules in
			// force: those are applied, and the NACK says which were
			// refused and why.
			p := &partialError{refused: refused, err: err}
			w.apply(resp, sum, cfg, domains, p)
			err = p
		}
		// Reported and counted once; refused again without a word.
		why = err.Error()
		w.refused = append(w.refused, refusal{sum: sum, why: why})
		if len(w.refused) > maxRefused {
			w.refused = w.refused[1:]
		}
		w.mu.Lock()
		w.stats.Failures++
		w.stats.LastError = err
		w.mu.Unlock()
		w.onError(err)
	}
	// A server may answer a NACK with the very update it refers to:
	// go-control-plane's snapshot cache does, until its snapshot changes
	// (envoyproxy/go-control-plane#962); one with two bad snapshots may
	// alternate, and a generator may make a new bad one each time.
	// Answering at once would spin both ends, so a refusal after a refusal
	// waits first (repeatBackoff); the rules and the counts stay as they
	// are. A valid update is taken at once, and so are the valid domains of
	// an update that refuses some.
	if w.refusing && !sleep(ctx, repeat.wait()) {
		return nil
	}
	w.refusing = true
	return w.nack(resp, why)
}

// apply puts the rules of an update in force: all of them when refused is
// nil, else those of its valid domains beside the rules in force of the
// domains it refused. The remembered refusals are forgotten either way:
// what they would keep has changed.
func (w *XDSWatcher) apply(resp *discoveryv3.DiscoveryResponse, sum [sha256.Size]byte, cfg *rules.Config, domains map[string]domainRules, refused *partialError) {
	w.inForce, w.refused, w.tooLarge = domains, nil, false
	version := resp.GetVersionInfo()
	if refused == nil {
		w.applied, w.hasApplied, w.refusing = sum, true, false
		w.version = version
	} else {
		// The server is told the last version applied whole (the NACK's
		// version_info); operators see what is in force.
		w.hasApplied = false
		version += " (" + refused.names() + " refused)"
	}
	now := w.cfg.Now()
	w.mu.Lock()
	w.stats.Loads++
	w.stats.Version = w.version
	w.stats.LastLoad = now
	w.stats.LastError = nil
	w.mu.Unlock()
	w.onLoad(Snapshot{Rules: cfg, Source: Source{Kind: SourceXDS, Location: w.cfg.ServerURL, Version: version, LoadedAt: now}})
}

func (w *XDSWatcher) ack(resp *discoveryv3.DiscoveryResponse) *discoveryv3.DiscoveryRequest {
	return &discoveryv3.DiscoveryRequest{
		Node:          w.node,
		TypeUrl:       RateLimitConfigType,
		VersionInfo:   resp.GetVersionInfo(),
		ResponseNonce: resp.GetNonce(),
	}
}

// nack refuses resp: version_info stays the last one applied, as the xDS
// protocol asks, and error_detail says why.
func (w *XDSWatcher) nack(resp *discoveryv3.DiscoveryResponse, why string) *discoveryv3.DiscoveryRequest {
	if len(why) > maxErrorDetail {
		// Cut on a rune boundary: a proto string must be valid UTF-8.
		cut := maxErrorDetail
		for cut > 0 && !utf8.RuneStart(why[cut]) {
			cut--
		}
		why = why[:cut] + " …"
	}
	return &discoveryv3.DiscoveryRequest{
		Node:          w.node,
		TypeUrl:       RateLimitConfigType,
		VersionInfo:   w.version,
		ResponseNonce: resp.GetNonce(),
		ErrorDetail:   &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: why},
	}
}

// refusal is an update refused: its hash and why.
type refusal struct {
	sum [sha256.Size]byte
	why string
}

// maxRefused bounds the refused updates remembered.
const maxRefused = 8

// refusedBefore returns why the update with sum was refused, if it is
// one of the last refused.
func (w *XDSWatcher) refusedBefore(sum [sha256.Size]byte) (string, bool) {
	for _, r := range w.refused {
		if r.sum == sum {
			return r.why, true
		}
	}
	return "", false
}

// hashResources identifies the content of an update, whatever its version
// and nonce, and whatever the order of its resources: go-control-plane's
// snapshot cache sends them in a new order each time (it walks a map), and
// an update sent again must be known as the one it is.
func hashResources(res []*anypb.Any) [sha256.Size]byte {
	sums := make([][sha256.Size]byte, len(res))
	var n [8]byte
	for i, r := range res {
		h := sha256.New()
		for _, s := range [][]byte{[]byte(r.GetTypeUrl()), r.GetValue()} {
			// Lengths first, so that no two resources hash the same by
			// moving bytes from the type to the value.
			binary.BigEndian.PutUint64(n[:], uint64(len(s)))
			h.Write(n[:])
			h.Write(s)
		}
		h.Sum(sums[i][:0])
	}
	slices.SortFunc(sums, func(a, b [sha256.Size]byte) int { return bytes.Compare(a[:], b[:]) })
	h := sha256.New()
	for _, s := range sums {
		h.Write(s[:])
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// domainRules are the resources of one domain in an update, as rules'
// sources, and the hash of their bytes.
type domainRules struct {
	sum  [sha256.Size]byte
	srcs []rules.Source
}

// changes reports whether the rules of next differ from those of in.
func changes(in, next map[string]domainRules) bool {
	if len(in) != len(next) {
		return true
	}
	for d, r := range next {
		if old, ok := in[d]; !ok || old.sum != r.sum {
			return true
		}
	}
	return false
}

// build decodes the resources of an update and builds their rules, with
// their domains. Every problem is one line of the error, naming the config
// and the descriptor: `xds: config "web" (domain web): descriptor
// "web.user": ...`.
//
// When some domains have problems of their own and the others none, build
// returns those problems, the domains refused, and the rules of the
// update with the rules in force of each refused domain in its place (none
// for a domain not in force): one policy the service cannot serve does not
// hold back every other domain's changes. A problem it cannot lay on one
// domain (a resource it cannot decode, the bound on all descriptors)
// refuses the update whole: the Config is nil.
func (w *XDSWatcher) build(res []*anypb.Any) (*rules.Config, map[string]domainRules, []string, error) {
	var errs []error
	srcs := make([]rules.Source, 0, len(res))
	var order []string
	anys := map[string][]*anypb.Any{}
	for i, r := range res {
		if r.GetTypeUrl() != RateLimitConfigType {
			errs = append(errs, fmt.Errorf("xds: resource %d: type %s, want %s", i+1, r.GetTypeUrl(), RateLimitConfigType))
			continue
		}
		var pb rlsconfv3.RateLimitConfig
		if err := r.UnmarshalTo(&pb); err != nil {
			errs = append(errs, fmt.Errorf("xds: resource %d: %w", i+1, err))
			continue
		}
		d := pb.GetDomain()
		if _, seen := anys[d]; !seen {
			order = append(order, d)
		}
		anys[d] = append(anys[d], r)
		srcs = append(srcs, sourceOf(&pb))
	}
	if len(errs) > 0 {
		return nil, nil, nil, errors.Join(errs...)
	}
	// In one order whatever the order of the resources, so that the
	// domains refused are named alike each time.
	slices.Sort(order)
	domains := make(map[string]domainRules, len(order))
	for _, src := range srcs {
		d := domains[src.Domain]
		d.srcs = append(d.srcs, src)
		domains[src.Domain] = d
	}
	for d, r := range domains {
		r.sum = hashResources(anys[d])
		domains[d] = r
	}
	cfg, err := rules.Build(srcs, w.cfg.Options)
	if err == nil {
		return cfg, domains, nil, nil
	}
	// Which domains have problems of their own?
	var refused []string
	var problems []error
	kept := make(map[string]domainRules, len(domains))
	var keptSrcs []rules.Source
	for _, d := range order {
		r := domains[d]
		if _, derr := rules.Build(r.srcs, w.cfg.Options); derr != nil {
			refused = append(refused, d)
			problems = append(problems, parts(derr)...)
			var ok bool
			if r, ok = w.inForce[d]; !ok {
				continue
			}
		}
		kept[d] = r
		keptSrcs = append(keptSrcs, r.srcs...)
	}
	if len(refused) == 0 {
		return nil, nil, nil, xdsProblems(err)
	}
	cfg, kerr := rules.Build(keptSrcs, w.cfg.Options)
	if kerr != nil {
		return nil, nil, nil, xdsProblems(err)
	}
	return cfg, kept, refused, xdsProblems(errors.Join(problems...))
}

// partialError is the refusal of some domains of an update whose other
// domains were applied.
type partialError struct {
	refused []string
	err     error
}

// names lists the domains refused: `domain "web"`, `domains "a", "b"`.
func (p *partialError) names() string {
	q := make([]string, len(p.refused))
	for i, d := range p.refused {
		q[i] = strconv.Quote(d)
	}
	if len(q) == 1 {
		return "domain " + q[0]
	}
	return "domains " + strings.Join(q, ", ")
}

func (p *partialError) Error() string {
	return "xds: " + p.names() + " refused and kept as in force; the update's other domains are applied\n" + p.err.Error()
}

func (p *partialError) Unwrap() error { return p.err }

// sourceOf converts a RateLimitConfig to the rules' data form, field for
// field, so that rules.Build checks it as Parse checks a rule file and
// each field means what it means there. The proto has every field of a
// rule file but value_to_metric, share_threshold and this service's
// extensions (quota_buckets, rate_limits, value_regex, algorithm, burst,
// unit_multiplier): rules from xDS cannot set those.
func sourceOf(pb *rlsconfv3.RateLimitConfig) rules.Source {
	name := fmt.Sprintf("config %q", pb.GetName())
	if pb.GetDomain() != "" {
		name += fmt.Sprintf(" (domain %s)", pb.GetDomain())
	}
	return rules.Source{Name: name, Domain: pb.GetDomain(), Descriptors: descriptorsOf(pb.GetDescriptors())}
}

func descriptorsOf(pbs []*rlsconfv3.RateLimitDescriptor) []rules.Descriptor {
	if len(pbs) == 0 {
		return nil
	}
	out := make([]rules.Descriptor, len(pbs))
	for i, d := range pbs {
		out[i] = rules.Descriptor{
			Key:            d.GetKey(),
			Value:          d.GetValue(),
			ShadowMode:     d.GetShadowMode(),
			QuotaMode:      d.GetQuotaMode(),
			DetailedMetric: d.GetDetailedMetric(),
			Descriptors:    descriptorsOf(d.GetDescriptors()),
		}
		if md := d.GetMetadata(); md != nil {
			// The value types of a rule file's metadata (numbers are
			// float64, as structpb sends them anyway).
			out[i].Metadata = md.AsMap()
		}
		if p := d.GetRateLimit(); p != nil {
			rl := &rules.RateLimit{
				Unit:            unitOf(p.GetUnit()),
				RequestsPerUnit: p.GetRequestsPerUnit(),
				Unlimited:       p.GetUnlimited(),
				Name:            p.GetName(),
			}
			for _, r := range p.GetReplaces() {
				rl.Replaces = append(rl.Replaces, r.GetName())
			}
			out[i].RateLimit = rl
		}
	}
	return out
}

// unitOf names an xDS unit by its number, which is rules.Unit's (WEEK is
// 7, MONTH 5, YEAR 6, as in Envoy's RateLimitResponse), so that a unit
// this build's proto may not name yet still reads as what it is. UNKNOWN
// is no unit; a number no unit has is named by the number, which
// rules.Build refuses as an invalid unit.
func unitOf(u rlsconfv3.RateLimitUnit) string {
	switch ru := rules.Unit(u); {
	case u == rlsconfv3.RateLimitUnit_UNKNOWN:
		return ""
	case ru.Seconds() > 0:
		return ru.String()
	}
	return strconv.Itoa(int(u))
}

// xdsProblem is a problem of a rules.Source built from xDS, named the way
// the xDS server and an operator read it.
type xdsProblem struct{ err *rules.Error }

func (p xdsProblem) Error() string { return "xds: " + p.err.File + ": " + p.err.Msg }
func (p xdsProblem) Unwrap() error { return p.err }

// xdsProblems rewrites the *rules.Error parts of a Build error.
func xdsProblems(err error) error {
	in := parts(err)
	out := make([]error, 0, len(in))
	for _, e := range in {
		var re *rules.Error
		if errors.As(e, &re) {
			out = append(out, xdsProblem{re})
		} else {
			out = append(out, e)
		}
	}
	return capProblems(errors.Join(out...))
}

// parts returns the errors joined in err, or err alone.
func parts(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// config builds the TLS configuration from the files.
func (t *XDSTLS) config() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("provider: xds tls: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("provider: xds tls: %s holds no PEM certificate", t.CAFile)
		}
	}
	if t.CertFile != "" || t.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("provider: xds tls: client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
