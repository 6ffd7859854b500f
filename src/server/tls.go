package server

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc/credentials"

	"github.com/ratelimitd/ratelimit/src/filewatch"
	"github.com/ratelimitd/ratelimit/src/stats"
)

// tlsFiles are the files of TLS on the gRPC listener, from the settings.
type tlsFiles struct {
	// cert and key are GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY.
	cert, key string
	// clientCA is GRPC_CLIENT_TLS_CACERT: when set, clients must present
	// a certificate signed by one of its CAs.
	clientCA string
	// clientSAN is GRPC_CLIENT_TLS_SAN: when set with clientCA, the
	// client certificate must hold it.
	clientSAN string
}

// How the TLS files are watched.
const (
	// tlsRecheck is how often the files are read again without a file
	// event, for what inotify does not see (network file systems, a
	// watch that could not be set up, a lost event). A read of three small
	// files compared with the last ones costs nothing worth counting.
	tlsRecheck = time.Minute
	// tlsQuiet is how long events must stop before the files are read,
	// and a change is taken once two reads this far apart agree
	// (filewatch), so that a writer that replaces the certificate and
	// then the key, not atomically, is taken once, after both.
	tlsQuiet = 200 * time.Millisecond
	// tlsExpiryWarning is how long before its end a certificate in use is
	// reported as about to expire: at load, and again each day. A
	// renewal (cert-manager renews a third of the lifetime before the
	// end) should have replaced it long before.
	tlsExpiryWarning = 7 * 24 * time.Hour
)

// tlsState is one loaded version of the files: immutable once published.
type tlsState struct {
	// sum identifies the files' contents, so that an unchanged re-read
	// is recognised without parsing.
	sum [sha256.Size]byte
	// config is what a gRPC handshake uses, and http what an HTTPS
	// handshake on PORT uses: the same but for the protocol offered.
	config, http *tls.Config
}

// serverTLS serves TLS on the gRPC listener from files that may change
// while the server runs (a Kubernetes secret update swaps them). Each
// handshake takes the version in force at that moment; established
// connections keep the one they were made with. A change that does not
// make a valid whole (a key that does not match the certificate, a file
// missing) keeps the version in force, logged and counted.
//
// It is safe for concurrent use once built by newServerTLS.
type serverTLS struct {
	files tlsFiles
	log   *slog.Logger
	// reloaded and failed count reloads after the first load.
	reloaded, failed *stats.Counter
	// refused counts handshakes that failed for another reason than the
	// client going away: plaintext, untrusted or missing certificates.
	refused *stats.Counter
	// recheck and quiet are tlsRecheck and tlsQuiet; tests shorten them.
	recheck, quiet time.Duration
	// newWatcher is fsnotify.NewWatcher; a test makes it fail to show
	// that the periodic re-check alone picks up a change.
	newWatcher func() (*fsnotify.Watcher, error)

	// now is time.Now; tests move it.
	now func() time.Time
	// notAfter is the gauge of the end of the certificate in use (Unix
	// seconds).
	notAfter *stats.Gauge
	// poke asks watch to read the files now (SIGHUP).
	poke chan struct{}

	cur atomic.Pointer[tlsState]
	// lastFailure is the last failure logged, so that files that stay
	// invalid are logged and counted once, not at every re-check, and
	// warned when the certificate in use was last said to be about to
	// expire. Only the goroutine of watch touches them.
	lastFailure string
	warned      time.Time
	// pending is what the watch's last read found.
	pending tlsRead
}

// newServerTLS loads the files once. An error names the setting of
// the file at fault, as a misconfiguration at start must stop the service.
func newServerTLS(files tlsFiles, reg *stats.Registry, log *slog.Logger) (*serverTLS, error) {
	tl := &serverTLS{
		files:      files,
		log:        log,
		reloaded:   reg.Counter("ratelimit.server.tls_reload_success"),
		failed:     reg.Counter("ratelimit.server.tls_reload_error"),
		refused:    reg.Counter("ratelimit.server.tls_handshake_error"),
		recheck:    tlsRecheck,
		quiet:      tlsQuiet,
		now:        time.Now,
		notAfter:   reg.Gauge("ratelimit.server.tls_cert_not_after"),
		poke:       make(chan struct{}, 1),
		newWatcher: fsnotify.NewWatcher,
	}
	st, err := tl.load()
	if err != nil {
		return nil, err
	}
	tl.publish(st)
	return tl, nil
}

// publish puts st in force and reports its certificate's end.
func (tl *serverTLS) publish(st *tlsState) {
	tl.cur.Store(st)
	tl.notAfter.Set(st.leaf().NotAfter.Unix())
	tl.warned = time.Time{}
	tl.warnExpiry()
}

// warnExpiry logs, at most once a day, that the certificate in use ends
// within tlsExpiryWarning.
func (tl *serverTLS) warnExpiry() {
	now, end := tl.now(), tl.cur.Load().leaf().NotAfter
	if end.Sub(now) > tlsExpiryWarning || (!tl.warned.IsZero() && now.Sub(tl.warned) < 24*time.Hour) {
		return
	}
	tl.warned = now
	tl.log.Warn("the TLS certificate in use expires soon; renew GRPC_SERVER_TLS_CERT", "not_after", end, "left", end.Sub(now).Round(time.Minute))
}

// leaf is the certificate served.
func (st *tlsState) leaf() *x509.Certificate { return st.config.Certificates[0].Leaf }

// reloadNow asks the watcher to read the files at once (SIGHUP); a read
// already asked for covers this one.
func (tl *serverTLS) reloadNow() {
	select {
	case tl.poke <- struct{}{}:
	default:
	}
}

// credentials returns the gRPC server's transport credentials.
func (tl *serverTLS) credentials() credentials.TransportCredentials {
	base := &tls.Config{
		// Called at every handshake: the version in force now.
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return tl.cur.Load().config, nil
		},
	}
	return countRefused{TransportCredentials: credentials.NewTLS(base), refused: tl.refused}
}

// httpConfig returns the configuration of HTTPS on PORT in force now: the
// gRPC listener's certificate, client CAs and SAN, for HTTP/1.1.
func (tl *serverTLS) httpConfig() *tls.Config { return tl.cur.Load().http }

// load reads and checks the files and builds their handshake config.
func (tl *serverTLS) load() (*tlsState, error) {
	contents, sum, err := tl.read()
	if err != nil {
		return nil, err
	}
	return tl.parse(contents, sum)
}

// read reads the files and sums their contents.
func (tl *serverTLS) read() ([3][]byte, [sha256.Size]byte, error) {
	var contents [3][]byte
	h := sha256.New()
	for i, f := range []struct{ setting, path string }{
		{"GRPC_SERVER_TLS_CERT", tl.files.cert},
		{"GRPC_SERVER_TLS_KEY", tl.files.key},
		{"GRPC_CLIENT_TLS_CACERT", tl.files.clientCA},
	} {
		if f.path == "" {
			continue
		}
		b, err := os.ReadFile(f.path)
		if err != nil {
			return contents, [sha256.Size]byte{}, fmt.Errorf("server: %s: %w", f.setting, err)
		}
		contents[i] = b
		// Length-prefixed, so that moving bytes from one file to the
		// next changes the sum.
		_ = binary.Write(h, binary.BigEndian, uint64(len(b)))
		h.Write(b)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return contents, sum, nil
}

// parse builds the handshake config from the files' contents.
func (tl *serverTLS) parse(contents [3][]byte, sum [sha256.Size]byte) (*tlsState, error) {
	certPEM, keyPEM, caPEM := contents[0], contents[1], contents[2]
	// tls.X509KeyPair names neither file; look at the certificate alone
	// first, so that the error names the setting at fault.
	if err := checkCertPEM(certPEM); err != nil {
		return nil, fmt.Errorf("server: GRPC_SERVER_TLS_CERT %s: %w", tl.files.cert, err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("server: GRPC_SERVER_TLS_KEY %s (with GRPC_SERVER_TLS_CERT %s): %w", tl.files.key, tl.files.cert, err)
	}
	// Every client refuses a certificate outside its dates: serving one
	// would refuse every new client. (The message leaves the time out, so
	// that the same files failing at each re-check are logged once.)
	switch now := tl.now(); {
	case now.Before(pair.Leaf.NotBefore):
		return nil, fmt.Errorf("server: GRPC_SERVER_TLS_CERT %s: not valid before %s", tl.files.cert, pair.Leaf.NotBefore.UTC().Format(time.RFC3339))
	case now.After(pair.Leaf.NotAfter):
		return nil, fmt.Errorf("server: GRPC_SERVER_TLS_CERT %s: expired on %s", tl.files.cert, pair.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	cfg := &tls.Config{
		Certificates: []tls.Certificate{pair},
		// grpc-go's credentials add both to a config of ours too; set
		// here, they hold whatever it does.
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2"},
		// A resumed session skips the full check of the client's
		// certificate against the CAs in force now; Envoy holds its
		// connections for hours, so a full handshake costs nothing.
		SessionTicketsDisabled: true,
	}
	if tl.files.clientCA != "" {
		// Only the file's CAs: the anchor adds the system's roots, which
		// would let any client with a certificate from a public CA in.
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, fmt.Errorf("server: GRPC_CLIENT_TLS_CACERT %s: no PEM certificate in it", tl.files.clientCA)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		if tl.files.clientSAN != "" {
			cfg.VerifyConnection = verifyClientSAN(tl.files.clientSAN)
		}
	}
	httpCfg := cfg.Clone()
	httpCfg.NextProtos = []string{"http/1.1"}
	return &tlsState{sum: sum, config: cfg, http: httpCfg}, nil
}

// checkCertPEM reports whether b holds a certificate Go can parse.
func checkCertPEM(b []byte) error {
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return errors.New("no PEM certificate in it")
		}
		if block.Type == "CERTIFICATE" {
			_, err := x509.ParseCertificate(block.Bytes)
			return err
		}
	}
}

// verifyClientSAN checks the client certificate, already verified against
// the CAs, for the name GRPC_CLIENT_TLS_SAN. The anchor verifies the chain
// again with this name as x509.VerifyOptions.DNSName, which comes down to
// the leaf's VerifyHostname: a DNS SAN, case-insensitive, where a wildcard
// SAN covers one label; an IP address matches an IP SAN; no other SAN type,
// and never the common name.
func verifyClientSAN(san string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("server: no client certificate")
		}
		if err := cs.PeerCertificates[0].VerifyHostname(san); err != nil {
			return fmt.Errorf("server: client certificate: %w", err)
		}
		return nil
	}
}

// tlsWatch is serverTLS as filewatch follows it: the files are read
// again when they changed and settled (a Secret update swaps them in
// steps), at every re-check, and at once on SIGHUP.
type tlsWatch serverTLS

// tlsRead is what a read of the files found.
type tlsRead struct {
	contents [3][]byte
	sum      [sha256.Size]byte
	err      error
}

func (f *tlsWatch) Watches() map[string]filewatch.Spec {
	// The directories that hold the files and every symlink on the way
	// to them: a Kubernetes secret volume holds name -> ..data/name and
	// swaps ..data by a rename in the same directory, which a watch on
	// the file would not see.
	dirs := map[string]filewatch.Spec{}
	for _, file := range []string{f.files.cert, f.files.key, f.files.clientCA} {
		if file == "" {
			continue
		}
		dirs[filepath.Dir(file)] = filewatch.Spec{All: true}
		for _, p := range filewatch.Links(file) {
			dirs[filepath.Dir(p)] = filewatch.Spec{All: true}
		}
		if real, err := filepath.EvalSymlinks(file); err == nil {
			dirs[filepath.Dir(real)] = filewatch.Spec{All: true}
		}
	}
	return dirs
}

func (f *tlsWatch) Read() filewatch.Fingerprint {
	r := &f.pending
	r.contents, r.sum, r.err = (*serverTLS)(f).read()
	if r.err != nil {
		return filewatch.Fingerprint(sha256.Sum256([]byte(r.err.Error())))
	}
	return r.sum
}

func (f *tlsWatch) Apply() {
	r := f.pending
	f.pending = tlsRead{}
	(*serverTLS)(f).apply(r)
}

func (f *tlsWatch) Current() filewatch.Fingerprint { return f.cur.Load().sum }

// Changed is the periodic re-check, which also warns of a certificate
// that ends soon.
func (f *tlsWatch) Changed() bool {
	tl := (*serverTLS)(f)
	tl.warnExpiry()
	_, sum, err := tl.read()
	return err != nil || sum != tl.cur.Load().sum
}

// apply publishes what a read found when it changed and makes a valid
// whole; otherwise it logs and counts the failure, once per distinct
// failure, and keeps the version in force.
func (tl *serverTLS) apply(r tlsRead) {
	err := r.err
	failure := ""
	if err == nil {
		if r.sum == tl.cur.Load().sum {
			tl.lastFailure = ""
			return
		}
		var st *tlsState
		if st, err = tl.parse(r.contents, r.sum); err == nil {
			tl.publish(st)
			tl.lastFailure = ""
			tl.reloaded.Inc()
			leaf := st.leaf()
			tl.log.Info("TLS files reloaded", "subject", leaf.Subject.String(), "serial", leaf.SerialNumber.String(), "not_after", leaf.NotAfter)
			return
		}
		// Two different invalid versions are two failures, even when
		// their errors read the same.
		failure = string(r.sum[:])
	}
	failure += err.Error()
	if failure == tl.lastFailure {
		return
	}
	tl.lastFailure = failure
	// Logged before it is counted, so that whoever sees the count can
	// find the line.
	tl.log.Error("TLS files changed but cannot be used; keeping the certificate in use", "err", err)
	tl.failed.Inc()
}

// watch follows the files until ctx is done.
func (tl *serverTLS) watch(ctx context.Context) {
	cfg := filewatch.Config{
		Quiet:      tl.quiet,
		Recheck:    tl.recheck,
		NewWatcher: tl.newWatcher,
		OnError:    func(err error) { tl.log.Debug("TLS file watch", "err", err) },
	}
	w, err := filewatch.New(cfg, (*tlsWatch)(tl))
	if err != nil {
		tl.log.Warn("cannot watch the TLS files; re-reading them periodically only", "every", tl.recheck, "err", err)
		w = filewatch.Polling(cfg, (*tlsWatch)(tl))
	}
	if err := w.Update(); err != nil {
		tl.log.Debug("TLS file watch", "err", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-tl.poke:
				w.Now()
			}
		}
	}()
	w.Run(ctx)
}

// countRefused counts the handshakes the listener refuses. grpc-go logs
// them at debug level only, so without a count a client locked out (a
// certificate from another CA, a plaintext client) would go unseen.
type countRefused struct {
	credentials.TransportCredentials
	refused *stats.Counter
}

// ServerHandshake counts a failure other than the client going away
// before the handshake, as load balancers' probes do.
func (c countRefused) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil && !errors.Is(err, io.EOF) {
		c.refused.Inc()
	}
	return out, info, err
}

// Clone keeps the count.
func (c countRefused) Clone() credentials.TransportCredentials {
	return countRefused{TransportCredentials: c.TransportCredentials.Clone(), refused: c.refused}
}
