package integration

import (
	"crypto/tls"
	"errors"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/harness"
)

// clientSAN is the name the tests' mTLS listeners ask of clients.
const clientSAN = "envoy.example.com"

// tlsSecret is a Kubernetes-style secret with the server's pair and, when
// clientCA is not nil, the clients' CA.
func tlsSecret(t *testing.T, server *harness.Cert, clientCA *harness.CA) *harness.SecretDir {
	t.Helper()
	return harness.NewSecretDir(t, secretContents(server, clientCA))
}

func secretContents(server *harness.Cert, clientCA *harness.CA) map[string][]byte {
	files := map[string][]byte{"tls.crt": server.CertPEM, "tls.key": server.KeyPEM}
	if clientCA != nil {
		files["ca.crt"] = clientCA.PEM
	}
	return files
}

// tlsSettings serve TLS from sec, with mTLS and clientSAN when mTLS.
func tlsSettings(sec *harness.SecretDir, mTLS bool) []string {
	env := []string{"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=" + sec.Path("tls.crt"), "GRPC_SERVER_TLS_KEY=" + sec.Path("tls.key")}
	if mTLS {
		env = append(env, "GRPC_CLIENT_TLS_CACERT="+sec.Path("ca.crt"), "GRPC_CLIENT_TLS_SAN="+clientSAN)
	}
	return env
}

// conn connects to p's gRPC listener with creds.
func (p *proc) conn(t *testing.T, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// tlsHealth asks cc for the health of service and returns the serial of
// the certificate the server presented.
func tlsHealth(t *testing.T, cc *grpc.ClientConn, service string) (*big.Int, error) {
	t.Helper()
	var pr peer.Peer
	r, err := healthpb.NewHealthClient(cc).Check(callCtx(t), &healthpb.HealthCheckRequest{Service: service}, grpc.Peer(&pr))
	if err != nil {
		return nil, err
	}
	if r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return nil, errors.New(r.GetStatus().String())
	}
	info, ok := pr.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return nil, errors.New("not over TLS")
	}
	return info.State.PeerCertificates[0].SerialNumber, nil
}

// servedWith reports whether a new connection with cfg gets a health
// check answered over TLS, and the serial of the certificate presented.
func (p *proc) servedWith(t *testing.T, cfg *tls.Config) (*big.Int, error) {
	t.Helper()
	cc, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	return tlsHealth(t, cc, "")
}

// refusedWith checks that a call over creds fails as a connection that
// could not be made does.
func (p *proc) refusedWith(t *testing.T, creds credentials.TransportCredentials) {
	t.Helper()
	_, err := tlsHealth(t, p.conn(t, creds), "")
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("health check = %v, want Unavailable", err)
	}
}

// TestGRPCTLS starts the service with mTLS and a client SAN, from files
// laid out as a Kubernetes secret, and speaks to it over the wire: the
// gRPC health check and ShouldRateLimit are served over TLS to a client
// with the right certificate, every other client is refused and counted,
// and /healthcheck stays plaintext on PORT.
func TestGRPCTLS(t *testing.T) {
	serverCA, clientCA, otherCA := harness.NewCA(t, "server CA"), harness.NewCA(t, "client CA"), harness.NewCA(t, "other CA")
	sec := tlsSecret(t, serverCA.Server(t), clientCA)
	p := start(t, map[string]string{"web.yaml": webRules}, tlsSettings(sec, true)...)
	good := clientCA.Client(t, clientSAN)

	t.Run("served", func(t *testing.T) {
		cc := p.conn(t, credentials.NewTLS(harness.ClientConfig(good, serverCA)))
		for _, name := range []string{"", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService"} {
			if _, err := tlsHealth(t, cc, name); err != nil {
				t.Errorf("gRPC health check %q over TLS: %v", name, err)
			}
		}
		resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(callCtx(t), request("web", "user", "tls"))
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("ShouldRateLimit over TLS = %v, %v; want OK", resp, err)
		}
	})
	refusals := []struct {
		name  string
		creds credentials.TransportCredentials
	}{
		{"plaintext", insecure.NewCredentials()},
		{"client_trusting_another_CA", credentials.NewTLS(harness.ClientConfig(good, otherCA))},
		{"no_client_certificate", credentials.NewTLS(harness.ClientConfig(nil, serverCA))},
		{"client_certificate_of_another_CA", credentials.NewTLS(harness.ClientConfig(otherCA.Client(t, clientSAN), serverCA))},
		{"wrong_SAN", credentials.NewTLS(harness.ClientConfig(clientCA.Client(t, "intruder.example.com"), serverCA))},
	}
	for _, tt := range refusals {
		t.Run(tt.name+"_refused", func(t *testing.T) {
			p.refusedWith(t, tt.creds)
		})
	}
	eventually(t, "the refused handshakes counted", 10*time.Second, func() bool {
		return p.stat(t, "ratelimit.server.tls_handshake_error") == "ratelimit.server.tls_handshake_error: 5"
	})
	if c := p.healthCode(); c != http.StatusOK {
		t.Errorf("plaintext GET /healthcheck = %d, want 200", c)
	}
}

// TestGRPCTLSTrustsTheCAFileAlone puts another CA among the system's roots
// (SSL_CERT_FILE): with mTLS, a client certificate it signed is refused,
// where the anchor, which adds the system's roots to GRPC_CLIENT_TLS_CACERT,
// lets it in.
func TestGRPCTLSTrustsTheCAFileAlone(t *testing.T) {
	serverCA, clientCA, publicCA := harness.NewCA(t, "server CA"), harness.NewCA(t, "client CA"), harness.NewCA(t, "a public CA")
	sec := tlsSecret(t, serverCA.Server(t), clientCA)
	roots := filepath.Join(t.TempDir(), "roots.pem")
	if err := os.WriteFile(roots, publicCA.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, map[string]string{"web.yaml": webRules}, append(tlsSettings(sec, true), "SSL_CERT_FILE="+roots)...)

	if _, err := p.servedWith(t, harness.ClientConfig(clientCA.Client(t, clientSAN), serverCA)); err != nil {
		t.Fatalf("a client of the CA file: %v", err)
	}
	p.refusedWith(t, credentials.NewTLS(harness.ClientConfig(publicCA.Client(t, clientSAN), serverCA)))
}

// TestGRPCTLSRotation swaps the secret's files as the kubelet does, with
// the service running: a connection made before keeps working, new ones
// get the new certificate within a deadline; a swap to a key of another
// certificate keeps the certificate in use, logged and counted.
func TestGRPCTLSRotation(t *testing.T) {
	ca1, ca2 := harness.NewCA(t, "CA one"), harness.NewCA(t, "CA two")
	first := ca1.Server(t)
	sec := tlsSecret(t, first, nil)
	p := start(t, map[string]string{"web.yaml": webRules}, tlsSettings(sec, false)...)

	// It trusts CA one alone: a new connection after the swap would fail.
	established := p.conn(t, credentials.NewTLS(harness.ClientConfig(nil, ca1)))
	if _, err := tlsHealth(t, established, ""); err != nil {
		t.Fatal(err)
	}

	second := ca2.Server(t)
	sec.Update(t, secretContents(second, nil))
	eventually(t, "the new certificate served to a new connection", 15*time.Second, func() bool {
		serial, err := p.servedWith(t, harness.ClientConfig(nil, ca2))
		return err == nil && serial.Cmp(second.Leaf.SerialNumber) == 0
	})
	resp, err := rlsv3.NewRateLimitServiceClient(established).ShouldRateLimit(callCtx(t), request("web", "user", "established"))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("the connection made before the swap: %v, %v; want OK", resp, err)
	}
	if got := p.stat(t, "ratelimit.server.tls_reload_success"); got != "ratelimit.server.tls_reload_success: 1" {
		t.Errorf("/stats: %q, want tls_reload_success 1", got)
	}

	sec.Update(t, map[string][]byte{"tls.crt": ca1.Server(t).CertPEM, "tls.key": first.KeyPEM})
	eventually(t, "the invalid swap counted", 15*time.Second, func() bool {
		return p.stat(t, "ratelimit.server.tls_reload_error") == "ratelimit.server.tls_reload_error: 1"
	})
	// stderr reaches the test through a pipe: poll for the line.
	eventually(t, "the invalid swap logged", 5*time.Second, func() bool {
		return strings.Contains(p.logs(), "keeping the certificate in use")
	})
	if serial, err := p.servedWith(t, harness.ClientConfig(nil, ca2)); err != nil || serial.Cmp(second.Leaf.SerialNumber) != 0 {
		t.Errorf("after the invalid swap: certificate %v, %v; want %v, no error", serial, err, second.Leaf.SerialNumber)
	}
}

// TestGRPCTLSStartupFailures checks that TLS files that cannot serve stop
// the service at start, non-zero, with a message naming the setting.
func TestGRPCTLSStartupFailures(t *testing.T) {
	ca := harness.NewCA(t, "CA")
	cert := ca.Server(t)
	dir := t.TempDir()
	for name, b := range map[string][]byte{"tls.crt": cert.CertPEM, "tls.key": cert.KeyPEM, "other.key": ca.Server(t).KeyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	path := func(name string) string { return filepath.Join(dir, name) }
	tests := []struct {
		name string
		env  []string
		want string
	}{
		{"no_files", []string{"GRPC_SERVER_USE_TLS=true"}, "GRPC_SERVER_TLS_CERT"},
		{"certificate_missing", []string{"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=" + path("missing.crt"), "GRPC_SERVER_TLS_KEY=" + path("tls.key")}, "GRPC_SERVER_TLS_CERT"},
		{"key_not_matching", []string{"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=" + path("tls.crt"), "GRPC_SERVER_TLS_KEY=" + path("other.key")}, "GRPC_SERVER_TLS_KEY"},
		{"client_ca_missing", []string{"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=" + path("tls.crt"), "GRPC_SERVER_TLS_KEY=" + path("tls.key"), "GRPC_CLIENT_TLS_CACERT=" + path("ca.crt")}, "GRPC_CLIENT_TLS_CACERT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := launch(t, map[string]string{"web.yaml": webRules}, tt.env...)
			if code := p.wait(t, 30*time.Second); code == 0 {
				t.Fatalf("exit code 0, want an error")
			}
			if !strings.Contains(p.logs(), tt.want) {
				t.Errorf("logs do not name %s:\n%s", tt.want, p.logs())
			}
		})
	}
}

// TestEnvoyGatewayTLSSettings starts the service with the TLS settings of
// Envoy Gateway's ratelimit Deployment, which sets GRPC_SERVER_TLS_CA_CERT,
// a name envoyproxy/ratelimit does not read: it starts without a warning
// about it, and serves TLS without asking for a client certificate, as the
// anchor does.
func TestEnvoyGatewayTLSSettings(t *testing.T) {
	ca := harness.NewCA(t, "envoy-gateway CA")
	sec := tlsSecret(t, ca.Server(t), ca)
	p := start(t, map[string]string{"web.yaml": webRules},
		"GRPC_SERVER_USE_TLS=true",
		"GRPC_SERVER_TLS_CERT="+sec.Path("tls.crt"),
		"GRPC_SERVER_TLS_KEY="+sec.Path("tls.key"),
		"GRPC_SERVER_TLS_CA_CERT="+sec.Path("ca.crt"))
	if _, err := p.servedWith(t, harness.ClientConfig(nil, ca)); err != nil {
		t.Fatalf("a client without a certificate: %v, want served", err)
	}
	// Warnings are written before the listeners open, so before start
	// saw /healthcheck answer.
	for _, s := range []string{"GRPC_SERVER_TLS_CA_CERT", "ignored"} {
		if strings.Contains(p.logs(), s) {
			t.Errorf("logs mention %q:\n%s", s, p.logs())
		}
	}
}

// postJSONWith posts body to /json on p's PORT with client (https:// when
// it has a TLS configuration) and returns the status, or the error.
func (p *proc) postJSONWith(t *testing.T, client *http.Client, scheme, body string) (int, error) {
	t.Helper()
	resp, err := client.Post(scheme+"://"+p.http+"/json", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// httpsClient is an HTTP client that speaks TLS with cfg, one connection
// per request.
func httpsClient(cfg *tls.Config) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
}

// TestJSONHasTheGRPCListenersTLS: with TLS on the gRPC listener, /json
// answers on PORT over TLS only, with the same certificate and the same
// client-certificate rules (CA and SAN), while /healthcheck stays
// plaintext on the same port for the kubelet (issue 24, case 8). Before,
// /json answered anyone in plaintext: a way around mTLS.
func TestJSONHasTheGRPCListenersTLS(t *testing.T) {
	const body = `{"domain":"web","descriptors":[{"entries":[{"key":"user","value":"json"}]}]}`
	serverCA, clientCA := harness.NewCA(t, "server CA"), harness.NewCA(t, "client CA")
	plain := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

	t.Run("mTLS", func(t *testing.T) {
		p := start(t, map[string]string{"web.yaml": webRules}, tlsSettings(tlsSecret(t, serverCA.Server(t), clientCA), true)...)
		if code, err := p.postJSONWith(t, plain, "http", body); err != nil || code != http.StatusForbidden {
			t.Errorf("plaintext POST /json with mTLS on: %d, %v; want 403", code, err)
		}
		if code := p.healthCode(); code != http.StatusOK {
			t.Errorf("plaintext GET /healthcheck: %d, want 200", code)
		}
		if code, err := p.postJSONWith(t, httpsClient(harness.ClientConfig(clientCA.Client(t, clientSAN), serverCA)), "https", body); err != nil || code != http.StatusOK {
			t.Errorf("POST /json over TLS with a client certificate: %d, %v; want 200", code, err)
		}
		for name, cfg := range map[string]*tls.Config{
			"no_client_certificate": harness.ClientConfig(nil, serverCA),
			"wrong_SAN":             harness.ClientConfig(clientCA.Client(t, "intruder.example.com"), serverCA),
		} {
			if code, err := p.postJSONWith(t, httpsClient(cfg), "https", body); err == nil {
				t.Errorf("POST /json over TLS, %s: %d, want the handshake refused", name, code)
			}
		}
		eventually(t, "the refused handshakes counted", 10*time.Second, func() bool {
			return p.stat(t, "ratelimit.server.tls_handshake_error") == "ratelimit.server.tls_handshake_error: 2"
		})
	})
	t.Run("TLS_without_client_certificates", func(t *testing.T) {
		p := start(t, map[string]string{"web.yaml": webRules}, tlsSettings(tlsSecret(t, serverCA.Server(t), nil), false)...)
		if code, err := p.postJSONWith(t, plain, "http", body); err != nil || code != http.StatusForbidden {
			t.Errorf("plaintext POST /json with TLS on: %d, %v; want 403", code, err)
		}
		if code, err := p.postJSONWith(t, httpsClient(harness.ClientConfig(nil, serverCA)), "https", body); err != nil || code != http.StatusOK {
			t.Errorf("POST /json over TLS: %d, %v; want 200", code, err)
		}
	})
	t.Run("plaintext_without_TLS", func(t *testing.T) {
		p := start(t, map[string]string{"web.yaml": webRules})
		if code, err := p.postJSONWith(t, plain, "http", body); err != nil || code != http.StatusOK {
			t.Errorf("plaintext POST /json without TLS: %d, %v; want 200, as the anchor", code, err)
		}
	})
}
