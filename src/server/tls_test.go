package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/settings"
	"github.com/ratelimitd/ratelimit/src/stats"
)

// secretFiles are the files of a Kubernetes TLS secret: the server's pair
// and, when clientCA is not nil, the CA of the clients.
func secretFiles(server *harness.Cert, clientCA *harness.CA) map[string][]byte {
	files := map[string][]byte{"tls.crt": server.CertPEM, "tls.key": server.KeyPEM}
	if clientCA != nil {
		files["ca.crt"] = clientCA.PEM
	}
	return files
}

// tlsEnv are the settings that serve TLS from sec; with mTLS, clients
// must present a certificate of sec's ca.crt.
func tlsEnv(sec *harness.SecretDir, mTLS bool, san string) map[string]string {
	// Every variable is set, empty if need be: t.Setenv keeps the values
	// of an earlier server of the same test.
	env := map[string]string{
		"GRPC_SERVER_USE_TLS":    "true",
		"GRPC_SERVER_TLS_CERT":   sec.Path("tls.crt"),
		"GRPC_SERVER_TLS_KEY":    sec.Path("tls.key"),
		"GRPC_CLIENT_TLS_CACERT": "",
		"GRPC_CLIENT_TLS_SAN":    san,
	}
	if mTLS {
		env["GRPC_CLIENT_TLS_CACERT"] = sec.Path("ca.crt")
	}
	return env
}

// dialWith connects to srv's gRPC listener with creds.
func dialWith(t *testing.T, srv *Server, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(srv.Addrs().GRPC.String(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// healthCheck asks cc for the service's health, and returns the error and
// the serial number of the certificate the server presented (nil if none).
func healthCheck(t *testing.T, cc *grpc.ClientConn) (*big.Int, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var p peer.Peer
	r, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: rlsServiceName}, grpc.Peer(&p))
	if err != nil {
		return nil, err
	}
	if r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return nil, errors.New(r.GetStatus().String())
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return nil, errors.New("not TLS")
	}
	return info.State.PeerCertificates[0].SerialNumber, nil
}

// refused checks that a call over cc fails as a connection that could not
// be made does.
func refused(t *testing.T, cc *grpc.ClientConn) {
	t.Helper()
	_, err := healthCheck(t, cc)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("health check = %v, want Unavailable", err)
	}
}

// awaitServing waits until the health check over cc answers SERVING: Run
// marks the service serving only once it has started, after start returns.
func awaitServing(t *testing.T, cc *grpc.ClientConn) {
	t.Helper()
	eventually(t, "the service serving", func() bool {
		_, err := healthCheck(t, cc)
		return err == nil
	})
}

// counter returns a counter of srv's registry.
func counter(srv *Server, name string) uint64 {
	return srv.stats.Snapshot()[name]
}

// TestTLSListener checks who the gRPC listener serves with TLS alone
// (GRPC_SERVER_USE_TLS, the server's pair): a client that trusts the
// server's CA, not a plaintext client nor one that trusts another CA; and
// that /healthcheck on PORT stays plaintext, as with the anchor.
func TestTLSListener(t *testing.T) {
	ca, other := harness.NewCA(t, "server CA"), harness.NewCA(t, "other CA")
	cert := ca.Server(t)
	sec := harness.NewSecretDir(t, secretFiles(cert, nil))
	srv, _ := start(t, serverRules, tlsEnv(sec, false, ""))

	t.Run("trusting_client_served", func(t *testing.T) {
		cc := dialWith(t, srv, credentials.NewTLS(harness.ClientConfig(nil, ca)))
		var serial *big.Int
		eventually(t, "a health check over TLS", func() bool {
			var err error
			serial, err = healthCheck(t, cc)
			return err == nil
		})
		if serial.Cmp(cert.Leaf.SerialNumber) != 0 {
			t.Errorf("served certificate %v, want %v", serial, cert.Leaf.SerialNumber)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, userRequest("web", "alice"))
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("ShouldRateLimit over TLS = %v, %v; want OK", resp, err)
		}
	})
	t.Run("plaintext_client_refused", func(t *testing.T) {
		before := counter(srv, "ratelimit.server.tls_handshake_error")
		refused(t, dialWith(t, srv, insecure.NewCredentials()))
		eventually(t, "the refusal counted", func() bool {
			return counter(srv, "ratelimit.server.tls_handshake_error") > before
		})
	})
	t.Run("client_trusting_another_CA_refused", func(t *testing.T) {
		refused(t, dialWith(t, srv, credentials.NewTLS(harness.ClientConfig(nil, other))))
	})
	t.Run("healthcheck_on_PORT_plaintext", func(t *testing.T) {
		if code, _ := get(t, "http://"+srv.Addrs().HTTP.String()+"/healthcheck"); code != 200 {
			t.Errorf("GET /healthcheck = %d, want 200", code)
		}
	})
}

// userRequest is a request for the rule of serverRules.
func userRequest(domain, user string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}},
	}}}
}

// TestMTLS checks GRPC_CLIENT_TLS_CACERT and GRPC_CLIENT_TLS_SAN over the
// wire: with a CA file, a client without a certificate, or with one of
// another CA, or with one the server's pair (server authentication only),
// is refused; with a SAN, a certificate of the CA without that name is
// refused too.
func TestMTLS(t *testing.T) {
	serverCA, clientCA, otherCA := harness.NewCA(t, "server CA"), harness.NewCA(t, "client CA"), harness.NewCA(t, "other CA")
	sec := harness.NewSecretDir(t, secretFiles(serverCA.Server(t), clientCA))
	const san = "envoy.example.com"
	withSAN, _ := start(t, serverRules, tlsEnv(sec, true, san))
	anySAN, _ := start(t, serverRules, tlsEnv(sec, true, ""))
	awaitServing(t, dialWith(t, withSAN, credentials.NewTLS(harness.ClientConfig(clientCA.Client(t, san), serverCA))))
	awaitServing(t, dialWith(t, anySAN, credentials.NewTLS(harness.ClientConfig(clientCA.Client(t, san), serverCA))))

	serverOnly := clientCA.Issue(t, harness.CertSpec{CommonName: san, DNSNames: []string{san}, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	tests := []struct {
		name   string
		srv    *Server
		cert   *harness.Cert // nil: none
		served bool
	}{
		{name: "right_san_served", srv: withSAN, cert: clientCA.Client(t, san), served: true},
		{name: "one_of_several_sans_served", srv: withSAN, cert: clientCA.Client(t, "other.example.com", san), served: true},
		{name: "wildcard_san_served", srv: withSAN, cert: clientCA.Client(t, "*.example.com"), served: true},
		{name: "no_certificate_refused", srv: withSAN},
		{name: "wrong_ca_refused", srv: withSAN, cert: otherCA.Client(t, san)},
		{name: "wrong_san_refused", srv: withSAN, cert: clientCA.Client(t, "other.example.com")},
		{name: "san_as_common_name_only_refused", srv: withSAN, cert: clientCA.Issue(t, harness.CertSpec{CommonName: san, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})},
		{name: "server_auth_only_refused", srv: withSAN, cert: serverOnly},
		{name: "no_san_setting_any_name_served", srv: anySAN, cert: clientCA.Client(t, "whoever.example.org"), served: true},
		{name: "no_san_setting_no_certificate_refused", srv: anySAN},
		{name: "no_san_setting_wrong_ca_refused", srv: anySAN, cert: otherCA.Client(t, san)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cc := dialWith(t, tt.srv, credentials.NewTLS(harness.ClientConfig(tt.cert, serverCA)))
			if !tt.served {
				before := counter(tt.srv, "ratelimit.server.tls_handshake_error")
				refused(t, cc)
				eventually(t, "the refusal counted", func() bool {
					return counter(tt.srv, "ratelimit.server.tls_handshake_error") > before
				})
				return
			}
			if _, err := healthCheck(t, cc); err != nil {
				t.Fatalf("health check = %v, want SERVING", err)
			}
		})
	}
}

// TestVerifyClientSAN pins how GRPC_CLIENT_TLS_SAN matches, which is the
// anchor's (x509 hostname verification of the leaf).
func TestVerifyClientSAN(t *testing.T) {
	ca := harness.NewCA(t, "client CA")
	tests := []struct {
		name string
		spec harness.CertSpec
		san  string
		ok   bool
	}{
		{name: "dns_exact", spec: harness.CertSpec{DNSNames: []string{"envoy.example.com"}}, san: "envoy.example.com", ok: true},
		{name: "dns_any_case", spec: harness.CertSpec{DNSNames: []string{"Envoy.Example.com"}}, san: "envoy.example.COM", ok: true},
		{name: "dns_other", spec: harness.CertSpec{DNSNames: []string{"envoy.example.org"}}, san: "envoy.example.com"},
		{name: "wildcard_one_label", spec: harness.CertSpec{DNSNames: []string{"*.example.com"}}, san: "envoy.example.com", ok: true},
		{name: "wildcard_two_labels", spec: harness.CertSpec{DNSNames: []string{"*.example.com"}}, san: "a.envoy.example.com"},
		{name: "setting_is_a_wildcard", spec: harness.CertSpec{DNSNames: []string{"envoy.example.com"}}, san: "*.example.com"},
		{name: "ip", spec: harness.CertSpec{IPs: []net.IP{net.ParseIP("10.1.2.3")}}, san: "10.1.2.3", ok: true},
		{name: "ip_as_dns_name", spec: harness.CertSpec{DNSNames: []string{"10.1.2.3"}}, san: "10.1.2.3"},
		{name: "uri_spiffe", spec: harness.CertSpec{URIs: []string{"spiffe://cluster.local/ns/gw/sa/envoy"}}, san: "spiffe://cluster.local/ns/gw/sa/envoy"},
		{name: "common_name", spec: harness.CertSpec{CommonName: "envoy.example.com"}, san: "envoy.example.com"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			leaf := ca.Issue(t, tt.spec).Leaf
			err := verifyClientSAN(tt.san)(tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}})
			if (err == nil) != tt.ok {
				t.Errorf("verifyClientSAN(%q) = %v, want ok %v", tt.san, err, tt.ok)
			}
		})
	}
}

// TestTLSRotation swaps the secret's files as the kubelet does: new
// connections get the new certificate within a deadline, a connection
// made before keeps working, and a swap to files that are not a valid
// whole keeps the certificate in use, logged and counted once.
func TestTLSRotation(t *testing.T) {
	ca1, ca2 := harness.NewCA(t, "CA one"), harness.NewCA(t, "CA two")
	first := ca1.Server(t)
	sec := harness.NewSecretDir(t, secretFiles(first, nil))
	var logs syncBuffer
	srv, _ := build(t, serverRules, tlsEnv(sec, false, ""), &logs)
	run(t, srv)

	// Trusts CA one only: if it had to connect again after the swap, its
	// calls would fail.
	established := dialWith(t, srv, credentials.NewTLS(harness.ClientConfig(nil, ca1)))
	// Health says SERVING once the server has started its store and
	// rules, which run may not have waited for.
	eventually(t, "the server serving over the first certificate", func() bool {
		_, err := healthCheck(t, established)
		return err == nil
	})

	second := ca2.Server(t)
	sec.Update(t, secretFiles(second, nil))
	eventually(t, "the new certificate served to a new connection", func() bool {
		cc, err := grpc.NewClient(srv.Addrs().GRPC.String(), grpc.WithTransportCredentials(credentials.NewTLS(harness.ClientConfig(nil, ca2))))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		serial, err := healthCheck(t, cc)
		return err == nil && serial.Cmp(second.Leaf.SerialNumber) == 0
	})
	if serial, err := healthCheck(t, established); err != nil || serial.Cmp(first.Leaf.SerialNumber) != 0 {
		t.Fatalf("established connection after the swap: certificate %v, %v; want %v, no error", serial, err, first.Leaf.SerialNumber)
	}
	refused(t, dialWith(t, srv, credentials.NewTLS(harness.ClientConfig(nil, ca1))))
	if got := counter(srv, "ratelimit.server.tls_reload_success"); got != 1 {
		t.Errorf("tls_reload_success = %d, want 1", got)
	}

	invalid := []struct {
		name  string
		files map[string][]byte
	}{
		{name: "key_of_another_certificate", files: map[string][]byte{"tls.crt": ca2.Server(t).CertPEM, "tls.key": first.KeyPEM}},
		{name: "key_missing", files: map[string][]byte{"tls.crt": ca2.Server(t).CertPEM}},
		{name: "certificate_truncated", files: map[string][]byte{"tls.crt": second.CertPEM[:len(second.CertPEM)/2], "tls.key": second.KeyPEM}},
	}
	for i, tt := range invalid {
		t.Run(tt.name, func(t *testing.T) {
			sec.Update(t, tt.files)
			eventually(t, "the failed reload counted", func() bool {
				return counter(srv, "ratelimit.server.tls_reload_error") == uint64(i+1)
			})
			serial, err := healthCheck(t, dialWith(t, srv, credentials.NewTLS(harness.ClientConfig(nil, ca2))))
			if err != nil || serial.Cmp(second.Leaf.SerialNumber) != 0 {
				t.Fatalf("after an invalid swap: certificate %v, %v; want %v, no error", serial, err, second.Leaf.SerialNumber)
			}
			if !strings.Contains(logs.String(), "keeping the certificate in use") {
				t.Errorf("no error logged:\n%s", logs.String())
			}
		})
	}

	third := ca1.Server(t)
	sec.Update(t, secretFiles(third, nil))
	eventually(t, "a valid swap after invalid ones", func() bool {
		cc, err := grpc.NewClient(srv.Addrs().GRPC.String(), grpc.WithTransportCredentials(credentials.NewTLS(harness.ClientConfig(nil, ca1))))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		serial, err := healthCheck(t, cc)
		return err == nil && serial.Cmp(third.Leaf.SerialNumber) == 0
	})
	if got, want := counter(srv, "ratelimit.server.tls_reload_error"), uint64(len(invalid)); got != want {
		t.Errorf("tls_reload_error = %d, want %d (once per invalid version)", got, want)
	}
}

// TestMTLSCARotation swaps the client CA file: a client of the new CA is
// served within a deadline, and a client of the old one is refused.
func TestMTLSCARotation(t *testing.T) {
	serverCA, old, next := harness.NewCA(t, "server CA"), harness.NewCA(t, "old client CA"), harness.NewCA(t, "new client CA")
	server := serverCA.Server(t)
	sec := harness.NewSecretDir(t, secretFiles(server, old))
	srv, _ := start(t, serverRules, tlsEnv(sec, true, ""))
	oldClient, nextClient := old.Client(t, "envoy"), next.Client(t, "envoy")

	awaitServing(t, dialWith(t, srv, credentials.NewTLS(harness.ClientConfig(oldClient, serverCA))))
	refused(t, dialWith(t, srv, credentials.NewTLS(harness.ClientConfig(nextClient, serverCA))))

	sec.Update(t, secretFiles(server, next))
	eventually(t, "a client of the new CA served", func() bool {
		cc, err := grpc.NewClient(srv.Addrs().GRPC.String(), grpc.WithTransportCredentials(credentials.NewTLS(harness.ClientConfig(nextClient, serverCA))))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		_, err = healthCheck(t, cc)
		return err == nil
	})
	refused(t, dialWith(t, srv, credentials.NewTLS(harness.ClientConfig(oldClient, serverCA))))
}

// TestTLSRecheckWithoutEvents shows that the periodic re-check alone picks
// up new files when they cannot be watched (no inotify instance left).
func TestTLSRecheckWithoutEvents(t *testing.T) {
	ca := harness.NewCA(t, "CA")
	sec := harness.NewSecretDir(t, secretFiles(ca.Server(t), nil))
	r, err := newServerTLS(tlsFiles{cert: sec.Path("tls.crt"), key: sec.Path("tls.key")}, stats.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	r.newWatcher = func() (*fsnotify.Watcher, error) { return nil, errors.New("too many open files") }
	r.recheck = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { r.watch(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })

	next := ca.Server(t)
	sec.Update(t, secretFiles(next, nil))
	eventually(t, "the re-check to load the new certificate", func() bool {
		return r.cur.Load().config.Certificates[0].Leaf.SerialNumber.Cmp(next.Leaf.SerialNumber) == 0
	})
}

// TestTLSInvalidFilesCountedOnce re-reads files that stay invalid, as
// every re-check does: the failure is logged and counted once, and again
// only for another invalid version.
func TestTLSInvalidFilesCountedOnce(t *testing.T) {
	ca := harness.NewCA(t, "CA")
	first := ca.Server(t)
	sec := harness.NewSecretDir(t, secretFiles(first, nil))
	reg := stats.NewRegistry()
	var logs syncBuffer
	r, err := newServerTLS(tlsFiles{cert: sec.Path("tls.crt"), key: sec.Path("tls.key")}, reg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	failed := func() uint64 { return reg.Snapshot()["ratelimit.server.tls_reload_error"] }

	sec.Update(t, map[string][]byte{"tls.crt": ca.Server(t).CertPEM, "tls.key": first.KeyPEM})
	for range 3 {
		r.reload()
	}
	if got := failed(); got != 1 {
		t.Errorf("after three reads of one invalid version: tls_reload_error = %d, want 1", got)
	}
	if n := strings.Count(logs.String(), "keeping the certificate in use"); n != 1 {
		t.Errorf("logged %d times, want once:\n%s", n, logs.String())
	}
	sec.Update(t, map[string][]byte{"tls.crt": ca.Server(t).CertPEM, "tls.key": first.KeyPEM})
	r.reload()
	if got := failed(); got != 2 {
		t.Errorf("after another invalid version: tls_reload_error = %d, want 2", got)
	}
	if got := r.cur.Load().config.Certificates[0].Leaf.SerialNumber; got.Cmp(first.Leaf.SerialNumber) != 0 {
		t.Errorf("certificate in use %v, want the first, %v", got, first.Leaf.SerialNumber)
	}
}

// TestTLSDates refuses a rotation to a certificate outside its dates
// (every client would refuse it), keeping the one in use, logged and
// counted once however often the files are read; takes it once its time
// has come; exports the end of the certificate in use and warns when it
// is near.
func TestTLSDates(t *testing.T) {
	ca := harness.NewCA(t, "CA")
	now := time.Now()
	first := ca.ServerValid(t, now.Add(-time.Hour), now.Add(30*24*time.Hour))
	sec := harness.NewSecretDir(t, secretFiles(first, nil))
	reg := stats.NewRegistry()
	var logs syncBuffer
	r, err := newServerTLS(tlsFiles{cert: sec.Path("tls.crt"), key: sec.Path("tls.key")}, reg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	r.now = func() time.Time { return now }
	inUse := func() *big.Int { return r.cur.Load().leaf().SerialNumber }
	notAfter := func() int64 { return reg.Gauges()["ratelimit.server.tls_cert_not_after"] }
	if got := notAfter(); got != first.Leaf.NotAfter.Unix() {
		t.Errorf("tls_cert_not_after = %d, want %d", got, first.Leaf.NotAfter.Unix())
	}

	for _, tt := range []struct {
		name string
		cert *harness.Cert
		want string
	}{
		{"expired", ca.ServerValid(t, now.Add(-48*time.Hour), now.Add(-time.Minute)), "expired on"},
		{"not_yet_valid", ca.ServerValid(t, now.Add(time.Hour), now.Add(48*time.Hour)), "not valid before"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			failedBefore := reg.Snapshot()["ratelimit.server.tls_reload_error"]
			sec.Update(t, secretFiles(tt.cert, nil))
			for range 3 {
				r.reload()
			}
			if inUse().Cmp(first.Leaf.SerialNumber) != 0 {
				t.Errorf("certificate in use %v, want the first one kept", inUse())
			}
			if got := reg.Snapshot()["ratelimit.server.tls_reload_error"] - failedBefore; got != 1 {
				t.Errorf("tls_reload_error went up by %d after three reads, want 1", got)
			}
			if !strings.Contains(logs.String(), tt.want) {
				t.Errorf("logs do not say %q:\n%s", tt.want, logs.String())
			}
		})
	}

	// The not-yet-valid certificate is still in the files: once its time
	// comes, the next read takes it.
	future := ca.ServerValid(t, now.Add(time.Hour), now.Add(3*24*time.Hour))
	sec.Update(t, secretFiles(future, nil))
	r.reload()
	now = now.Add(2 * time.Hour)
	r.reload()
	if inUse().Cmp(future.Leaf.SerialNumber) != 0 {
		t.Fatalf("certificate in use %v once valid, want %v", inUse(), future.Leaf.SerialNumber)
	}
	if got := notAfter(); got != future.Leaf.NotAfter.Unix() {
		t.Errorf("tls_cert_not_after = %d, want %d", got, future.Leaf.NotAfter.Unix())
	}
	// It ends within a week: warned at load, then once a day.
	warnings := func() int { return strings.Count(logs.String(), "expires soon") }
	if warnings() != 1 {
		t.Errorf("%d warnings that the certificate expires soon after loading it, want 1:\n%s", warnings(), logs.String())
	}
	r.warnExpiry()
	now = now.Add(25 * time.Hour)
	r.warnExpiry()
	r.warnExpiry()
	if warnings() != 2 {
		t.Errorf("%d warnings a day later, want 2", warnings())
	}
}

// TestTLSStartupErrors checks that files that cannot serve stop the start
// with an error naming the setting at fault.
func TestTLSStartupErrors(t *testing.T) {
	ca := harness.NewCA(t, "CA")
	cert, other := ca.Server(t), ca.Server(t)
	expired := ca.ServerValid(t, time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour))
	future := ca.ServerValid(t, time.Now().Add(time.Hour), time.Now().Add(48*time.Hour))
	tests := []struct {
		name  string
		files map[string][]byte // written in a directory; the settings point at tls.crt, tls.key and ca.crt
		mTLS  bool
		want  string
	}{
		{name: "certificate_missing", files: map[string][]byte{"tls.key": cert.KeyPEM}, want: "GRPC_SERVER_TLS_CERT"},
		{name: "key_missing", files: map[string][]byte{"tls.crt": cert.CertPEM}, want: "GRPC_SERVER_TLS_KEY"},
		{name: "key_not_matching", files: map[string][]byte{"tls.crt": cert.CertPEM, "tls.key": other.KeyPEM}, want: "GRPC_SERVER_TLS_KEY"},
		{name: "certificate_not_pem", files: map[string][]byte{"tls.crt": []byte("not a certificate"), "tls.key": cert.KeyPEM}, want: "GRPC_SERVER_TLS_CERT"},
		{name: "files_swapped", files: map[string][]byte{"tls.crt": cert.KeyPEM, "tls.key": cert.CertPEM}, want: "GRPC_SERVER_TLS_CERT"},
		{name: "key_empty", files: map[string][]byte{"tls.crt": cert.CertPEM, "tls.key": nil}, want: "GRPC_SERVER_TLS_KEY"},
		{name: "client_ca_missing", files: map[string][]byte{"tls.crt": cert.CertPEM, "tls.key": cert.KeyPEM}, mTLS: true, want: "GRPC_CLIENT_TLS_CACERT"},
		{name: "certificate_expired", files: map[string][]byte{"tls.crt": expired.CertPEM, "tls.key": expired.KeyPEM}, want: "GRPC_SERVER_TLS_CERT"},
		{name: "certificate_not_yet_valid", files: map[string][]byte{"tls.crt": future.CertPEM, "tls.key": future.KeyPEM}, want: "GRPC_SERVER_TLS_CERT"},
		{name: "client_ca_without_certificate", files: map[string][]byte{"tls.crt": cert.CertPEM, "tls.key": cert.KeyPEM, "ca.crt": cert.KeyPEM}, mTLS: true, want: "GRPC_CLIENT_TLS_CACERT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, b := range tt.files {
				if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			env := map[string]string{
				"GRPC_SERVER_USE_TLS":  "true",
				"GRPC_SERVER_TLS_CERT": filepath.Join(dir, "tls.crt"),
				"GRPC_SERVER_TLS_KEY":  filepath.Join(dir, "tls.key"),
			}
			if tt.mTLS {
				env["GRPC_CLIENT_TLS_CACERT"] = filepath.Join(dir, "ca.crt")
			}
			// The setting at fault comes first; others may follow.
			err := newErr(t, env)
			if err == nil || !strings.HasPrefix(err.Error(), "server: "+tt.want+" ") && !strings.HasPrefix(err.Error(), "server: "+tt.want+":") {
				t.Fatalf("New = %v, want an error about %s", err, tt.want)
			}
		})
	}
}

// newErr builds a server with serverRules and env, and returns New's
// error; a server it built is closed at once.
func newErr(t *testing.T, env map[string]string) error {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "config", "web.yaml"), []byte(serverRules), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("RUNTIME_ROOT", root)
	for _, k := range []string{"PORT", "GRPC_PORT", "DEBUG_PORT"} {
		t.Setenv(k, "0")
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	set, err := settings.Load()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(context.Background(), set, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil {
		run(t, srv)()
	}
	return err
}

// reload reads the files and applies them, as the watch does once they
// have settled.
func (tl *serverTLS) reload() {
	w := (*tlsWatch)(tl)
	w.Read()
	w.Apply()
}
