package integration

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
)

// The Envoy Gateway scenario with Envoy itself as the client: the service
// with the TLS settings Envoy Gateway's Deployment gives it, Envoy calling
// it over TLS (and with a client certificate, mTLS), the service's
// certificate rotated while Envoy stays connected.

// tlsRLSCluster is the service's cluster over TLS: Envoy trusts caFile
// alone, checks the name localhost, and presents certFile/keyFile when they
// are set. Connections last at most maxConn, so that Envoy makes a new one
// (a new handshake) while the test watches.
func tlsRLSCluster(addr, caFile, certFile, keyFile string, maxConn time.Duration) string {
	client := ""
	if certFile != "" {
		client = fmt.Sprintf(`
          tls_certificates:
          - certificate_chain: {filename: %s}
            private_key: {filename: %s}`, certFile, keyFile)
	}
	return harness.EnvoyCluster("ratelimit", addr, false, fmt.Sprintf(`
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        common_http_protocol_options: {max_connection_duration: %gs}
        explicit_http_config:
          http2_protocol_options: {}
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: localhost
        common_tls_context:%s
          validation_context:
            trusted_ca: {filename: %s}
            match_typed_subject_alt_names:
            - san_type: DNS
              matcher: {exact: localhost}`, maxConn.Seconds(), client, caFile))
}

// tlsEnvoyBootstrap is httpBootstrap's single listener, limited by
// (user=x-user) in domain through a fail-closed filter, calling the
// service over cluster (a tlsRLSCluster).
func tlsEnvoyBootstrap(t *testing.T, up *upstream, domain, cluster string) string {
	t.Helper()
	return envoyConfig(t, httpBootstrap, map[string]string{
		"AccessLog": filepath.Join(t.TempDir(), "access.log"),
		"Routes":    userRoute,
		"Filters":   rateLimitFilter(domain, ""),
		"Clusters":  "",
		"Upstream":  httpCluster("upstream", up.addr),
		"RLS":       cluster,
	})
}

// writeFiles writes name -> content into a new directory.
func writeFiles(t *testing.T, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestRealEnvoyGatewayTLS(t *testing.T) {
	slow(t)
	ca := harness.NewCA(t, "envoy-gateway CA")
	first := ca.Server(t)
	sec := tlsSecret(t, first, ca)
	egEnv := []string{
		"GRPC_SERVER_USE_TLS=true",
		"GRPC_SERVER_TLS_CERT=" + sec.Path("tls.crt"),
		"GRPC_SERVER_TLS_KEY=" + sec.Path("tls.key"),
		"GRPC_SERVER_TLS_CA_CERT=" + sec.Path("ca.crt"),
	}
	envoyCert := ca.Client(t, clientSAN)
	envoyFiles := writeFiles(t, map[string][]byte{"ca.crt": ca.PEM, "tls.crt": envoyCert.CertPEM, "tls.key": envoyCert.KeyPEM})
	path := func(name string) string { return filepath.Join(envoyFiles, name) }
	up := startUpstream(t)
	rules := map[string]string{"hdr.yaml": headerRules}

	t.Run("tls", func(t *testing.T) {
		p := start(t, rules, egEnv...)
		e := startEnvoy(t, tlsEnvoyBootstrap(t, up, "hdr", tlsRLSCluster(p.grpc, path("ca.crt"), "", "", time.Hour)))
		driveEnvoy(t, p, e.listener(t, "http"), up, envoyHTTPCase{name: "tls", path: "/",
			headers: map[string]string{"x-user": "over-tls"}, admitted: 3, rules: []string{"hdr.user"}})
	})

	t.Run("mtls", func(t *testing.T) {
		p := start(t, rules, append(egEnv, "GRPC_CLIENT_TLS_CACERT="+sec.Path("ca.crt"), "GRPC_CLIENT_TLS_SAN="+clientSAN)...)
		e := startEnvoy(t, tlsEnvoyBootstrap(t, up, "hdr", tlsRLSCluster(p.grpc, path("ca.crt"), path("tls.crt"), path("tls.key"), time.Hour)))
		driveEnvoy(t, p, e.listener(t, "http"), up, envoyHTTPCase{name: "mtls", path: "/",
			headers: map[string]string{"x-user": "over-mtls"}, admitted: 3, rules: []string{"hdr.user"}})

		// An Envoy without a client certificate is refused by the service:
		// its fail-closed filter answers 500.
		anon := startEnvoy(t, tlsEnvoyBootstrap(t, up, "hdr", tlsRLSCluster(p.grpc, path("ca.crt"), "", "", time.Hour)))
		if r := httpGet(t, anon.listener(t, "http"), "/", map[string]string{"x-user": "anonymous"}); r.code != http.StatusInternalServerError {
			t.Errorf("Envoy without a client certificate: HTTP %d, want 500 (refused by the service, fail closed)", r.code)
		}
	})

	// Envoy Gateway's whole scenario: rules over xDS, counts in Redis,
	// mTLS, and the certificate rotated while Envoy is connected.
	t.Run("rotation", func(t *testing.T) {
		xds := harness.StartXDS(t, harness.XDSOptions{})
		xds.SetConfigs(t, egNode, xdsWeb(3, 100))
		r := harness.StartRedis(t, harness.RedisOptions{})
		p := launch(t, nil, append(append(egEnv, redisEnv(r)...),
			"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL="+xds.Addr, "CONFIG_GRPC_XDS_NODE_ID="+egNode,
			"GRPC_CLIENT_TLS_CACERT="+sec.Path("ca.crt"), "GRPC_CLIENT_TLS_SAN="+clientSAN)...)
		p.waitHealth(t, http.StatusOK)
		// Envoy replaces its connection to the service every second.
		e := startEnvoy(t, tlsEnvoyBootstrap(t, up, "web", tlsRLSCluster(p.grpc, path("ca.crt"), path("tls.crt"), path("tls.key"), time.Second)))
		addr := e.listener(t, "http")
		driveEnvoy(t, p, addr, up, envoyHTTPCase{name: "before", path: "/",
			headers: map[string]string{"x-user": "before"}, admitted: 3, rules: []string{"web.user"}})
		ask := func(user string) int { return httpGet(t, addr, "/", map[string]string{"x-user": user}).code }
		second := ca.Server(t)
		sec.Update(t, secretContents(second, ca))
		eventually(t, "the new certificate served", 15*time.Second, func() bool {
			serial, err := p.servedWith(t, harness.ClientConfig(envoyCert, ca))
			return err == nil && serial.Cmp(second.Leaf.SerialNumber) == 0
		})
		// From now on every new connection gets the new certificate. Envoy
		// goes on without an error while its connection is replaced and
		// it handshakes with the new certificate.
		handshakes := e.counter(t, "cluster.ratelimit.ssl.handshake")
		i := 0
		harness.WaitForNil(t, 30*time.Second, "a new connection from Envoy", func() error {
			if n := e.counter(t, "cluster.ratelimit.ssl.handshake"); n < handshakes+1 {
				// A user per request: every answer is an OK.
				if code := ask(fmt.Sprintf("during-%d", i)); code != http.StatusOK {
					t.Fatalf("request %d during the rotation: HTTP %d, want 200", i, code)
				}
				i++
				return fmt.Errorf("%d handshakes", n)
			}
			return nil
		})
		if code := ask("after"); code != http.StatusOK {
			t.Errorf("after the rotation: HTTP %d", code)
		}
		// The user over the limit before the rotation is still over it.
		if code := ask("before"); code != http.StatusTooManyRequests {
			t.Errorf("the user over the limit before the rotation: HTTP %d, want 429", code)
		}
		for _, name := range []string{"cluster.ratelimit.ssl.connection_error", "cluster.upstream.ratelimit.error"} {
			if n := e.counter(t, name); n != 0 {
				t.Errorf("envoy %s = %d, want 0", name, n)
			}
		}
	})
}
