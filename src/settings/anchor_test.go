package settings

import (
	"bufio"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// structSettings returns the envconfig name and default of every field of
// Settings.
func structSettings(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	typ := reflect.TypeFor[Settings]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		name, ok := f.Tag.Lookup("envconfig")
		if !ok {
			if f.IsExported() {
				t.Errorf("Settings.%s has no envconfig tag", f.Name)
			}
			continue
		}
		if _, dup := out[name]; dup {
			t.Errorf("%s is the name of two fields of Settings", name)
		}
		out[name] = f.Tag.Get("default")
	}
	return out
}

// docRow is one row of docs/SETTINGS.md. A default of nil is "—": none.
type docRow struct {
	line        int
	status      string
	def, anchor *string
	notes       string
}

// readSettingsDoc parses the rows of the tables of docs/SETTINGS.md whose
// first cell is a variable: | `NAME` | status | default | anchor | notes |.
func readSettingsDoc(t *testing.T) map[string]docRow {
	t.Helper()
	f, err := os.Open("../../docs/SETTINGS.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	value := func(cell string) (*string, error) {
		switch {
		case cell == "—":
			return nil, nil
		case cell == "":
			return new(string), nil
		case len(cell) >= 2 && strings.HasPrefix(cell, "`") && strings.HasSuffix(cell, "`"):
			v := cell[1 : len(cell)-1]
			return &v, nil
		}
		return nil, fmt.Errorf("default %q: want `value`, blank (empty) or — (none)", cell)
	}
	rows := map[string]docRow{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.SplitN(strings.TrimPrefix(line, "|"), "|", 5)
		if len(cells) != 5 {
			t.Errorf("SETTINGS.md:%d: want 5 cells: %s", n, line)
			continue
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		name := strings.Trim(cells[0], "`")
		if cells[0] != "`"+name+"`" || strings.ContainsAny(name, "` ,") {
			t.Errorf("SETTINGS.md:%d: first cell %q: want one `VARIABLE` per row", n, cells[0])
			continue
		}
		r := docRow{line: n, status: cells[1], notes: strings.TrimSuffix(cells[4], "|")}
		if r.def, err = value(cells[2]); err != nil {
			t.Errorf("SETTINGS.md:%d: %s: %v", n, name, err)
		}
		if r.anchor, err = value(cells[3]); err != nil {
			t.Errorf("SETTINGS.md:%d: %s: anchor %v", n, name, err)
		}
		if prev, dup := rows[name]; dup {
			t.Errorf("SETTINGS.md:%d: %s already has a row, at line %d", n, name, prev.line)
		}
		rows[name] = r
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rows
}

// cell writes a default as docs/SETTINGS.md does.
func cell(v *string) string {
	switch {
	case v == nil:
		return "—"
	case *v == "":
		return ""
	}
	return "`" + *v + "`"
}

// TestAnchorSettingsAgreeWithSettings checks the list of the anchor's
// settings against the Settings struct: what it calls implemented is a
// field, what it calls not implemented is not, and "same" has the
// anchor's default.
func TestAnchorSettingsAgreeWithSettings(t *testing.T) {
	ours := structSettings(t)
	seen := map[string]bool{}
	for _, a := range anchorSettings {
		if seen[a.Name] {
			t.Errorf("%s is listed twice", a.Name)
		}
		seen[a.Name] = true
		def, implemented := ours[a.Name]
		switch a.Status {
		case Same, Different:
			if !implemented {
				t.Errorf("%s: status %q, but Settings has no such field", a.Name, a.Status)
			}
			if a.Status == Same && def != a.Default {
				t.Errorf("%s: status same, but the default is %q here and %q in the anchor", a.Name, def, a.Default)
			}
			if a.Why != "" || a.honoured != nil {
				t.Errorf("%s: implemented, but has a Why or honoured values", a.Name)
			}
		case Warned, Refused:
			if implemented {
				t.Errorf("%s: status %q, but Settings has it: give it status same or different", a.Name, a.Status)
			}
			if a.Why == "" {
				t.Errorf("%s: status %q without a Why", a.Name, a.Status)
			}
		default:
			t.Errorf("%s: no status", a.Name)
		}
	}
}

// TestSettingsDocument checks docs/SETTINGS.md against the code, so that
// it cannot drift: one row per variable of Settings and per setting of the
// anchor, with the status and the defaults the code has, and no row for a
// variable the code does not know.
func TestSettingsDocument(t *testing.T) {
	ours := structSettings(t)
	anchor := map[string]AnchorSetting{}
	for _, a := range AnchorSettings() {
		anchor[a.Name] = a
	}
	rows := readSettingsDoc(t)

	want := func(name, status string, def, anchorDef *string) {
		t.Helper()
		r, ok := rows[name]
		if !ok {
			t.Errorf("docs/SETTINGS.md has no row for %s: add | `%s` | %s | %s | %s | notes |", name, name, status, cell(def), cell(anchorDef))
			return
		}
		if r.status != status {
			t.Errorf("SETTINGS.md:%d: %s: status %q, want %q", r.line, name, r.status, status)
		}
		if cell(r.def) != cell(def) {
			t.Errorf("SETTINGS.md:%d: %s: default %q, want %q", r.line, name, cell(r.def), cell(def))
		}
		if cell(r.anchor) != cell(anchorDef) {
			t.Errorf("SETTINGS.md:%d: %s: anchor's default %q, want %q", r.line, name, cell(r.anchor), cell(anchorDef))
		}
		if status == Different.String() && r.notes == "" {
			t.Errorf("SETTINGS.md:%d: %s differs on purpose: say how in its notes", r.line, name)
		}
	}
	for name, def := range ours {
		a, isAnchor := anchor[name]
		if !isAnchor {
			want(name, "ours", &def, nil)
			continue
		}
		want(name, a.Status.String(), &def, &a.Default)
	}
	for name, a := range anchor {
		if _, implemented := ours[name]; !implemented {
			want(name, a.Status.String(), nil, &a.Default)
		}
	}
	for name, r := range rows {
		_, inStruct := ours[name]
		_, inAnchor := anchor[name]
		if !inStruct && !inAnchor {
			t.Errorf("SETTINGS.md:%d: %s is neither a field of Settings nor a setting of the anchor", r.line, name)
		}
	}
}

// TestAnchorSettingsNotImplemented sets the anchor's settings that are not
// implemented: a value that asks for a refused one stops Load with an
// error naming it, one that asks for a warned one gives one warning naming
// it, and values that ask for nothing are accepted silently. The gRPC TLS
// settings, implemented, are here too: set without effect, as in the
// anchor, they warn the same way.
func TestAnchorSettingsNotImplemented(t *testing.T) {
	tests := []struct {
		name     string
		env      map[string]string
		errs     []string // each must be in the error; none means no error
		warnings []string // the names warned about, in order
	}{
		{name: "none"},
		{name: "config_type_xds", env: map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW"}},
		{name: "config_type_unknown", env: map[string]string{"CONFIG_TYPE": "GRPC_XDS_DELTA"}, errs: []string{"CONFIG_TYPE", "GRPC_XDS_DELTA"}},
		{name: "config_type_file", env: map[string]string{"CONFIG_TYPE": "file"}},
		{name: "config_type_empty", env: map[string]string{"CONFIG_TYPE": ""}},
		{name: "grpc_tls", env: map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/c.pem", "GRPC_SERVER_TLS_KEY": "/k.pem"}},
		{name: "grpc_mtls", env: map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/c.pem", "GRPC_SERVER_TLS_KEY": "/k.pem",
			"GRPC_CLIENT_TLS_CACERT": "/ca.pem", "GRPC_CLIENT_TLS_SAN": "envoy.example.com"}},
		{name: "grpc_tls_without_key", env: map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/c.pem"}, errs: []string{"GRPC_SERVER_TLS_KEY"}},
		{name: "grpc_tls_without_files", env: map[string]string{"GRPC_SERVER_USE_TLS": "true"}, errs: []string{"GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY"}},
		{name: "grpc_tls_not_a_bool", env: map[string]string{"GRPC_SERVER_USE_TLS": "yes please"}, errs: []string{"GRPC_SERVER_USE_TLS"}},
		{name: "grpc_tls_off", env: map[string]string{"GRPC_SERVER_USE_TLS": "false"}},
		{name: "grpc_tls_files_without_tls", env: map[string]string{"GRPC_SERVER_TLS_CERT": "/c.pem", "GRPC_CLIENT_TLS_CACERT": "/ca.pem"},
			warnings: []string{"GRPC_CLIENT_TLS_CACERT", "GRPC_SERVER_TLS_CERT"}},
		{name: "grpc_tls_san_without_ca", env: map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/c.pem", "GRPC_SERVER_TLS_KEY": "/k.pem",
			"GRPC_CLIENT_TLS_SAN": "envoy.example.com"}, warnings: []string{"GRPC_CLIENT_TLS_SAN"}},
		// Envoy Gateway's deployment sets GRPC_SERVER_TLS_CA_CERT, a name
		// the anchor does not read: it must change nothing here either.
		{name: "envoy_gateway_ca_name", env: map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/certs/tls.crt", "GRPC_SERVER_TLS_KEY": "/certs/tls.key",
			"GRPC_SERVER_TLS_CA_CERT": "/certs/ca.crt"}},
		{name: "envoy_gateway_ca_name_without_tls", env: map[string]string{"GRPC_SERVER_TLS_CA_CERT": "/certs/ca.crt"}},
		{name: "mixed_warnings_sorted", env: map[string]string{"GRPC_CLIENT_TLS_SAN": "x", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318", "PROMETHEUS_MAPPER_YAML": "/m.yaml"},
			warnings: []string{"GRPC_CLIENT_TLS_SAN", "OTEL_EXPORTER_OTLP_ENDPOINT"}},
		{name: "prometheus_mapping", env: map[string]string{"PROMETHEUS_MAPPER_YAML": "/m.yaml", "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS": "false"}},
		{name: "prometheus_milliseconds", env: map[string]string{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS": "true"}},
		{name: "prometheus_milliseconds_with_mapping", env: map[string]string{"PROMETHEUS_MAPPER_YAML": "/m.yaml", "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS": "true"},
			warnings: []string{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS"}},
		{name: "statsd_on", env: map[string]string{"USE_STATSD": "true", "STATSD_HOST": "statsd", "EXTRA_TAGS": "a:b"}},
		{name: "statsd_off", env: map[string]string{"USE_STATSD": "false"}},
		{name: "dogstatsd_with_statsd_default", env: map[string]string{"USE_DOG_STATSD": "true"}},
		{name: "prometheus_with_stats_disabled", env: map[string]string{"DISABLE_STATS": "true", "USE_PROMETHEUS": "true"}, warnings: []string{"USE_PROMETHEUS"}},
		{name: "mogrifiers_without_dogstatsd", env: map[string]string{"USE_DOG_STATSD_MOGRIFIERS": "TAG"}, warnings: []string{"USE_DOG_STATSD_MOGRIFIERS"}},
		{name: "xds_client_with_files", env: map[string]string{"CONFIG_GRPC_XDS_SERVER_URL": "xds:18000", "CONFIG_GRPC_XDS_SERVER_USE_TLS": "false"}},
		{name: "xds_client_with_xds", env: map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "xds:18000"}},
		// An endpoint without tracing: spans were expected there.
		{name: "otel_endpoint_without_tracing", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318"}, warnings: []string{"OTEL_EXPORTER_OTLP_ENDPOINT"}},
		{name: "tracing", env: map[string]string{"TRACING_ENABLED": "true", "TRACING_SAMPLING_RATE": "0.1", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318"}},
		{name: "tracing_off", env: map[string]string{"TRACING_ENABLED": "false"}},
		{name: "descriptor_key_config", env: map[string]string{"DESCRIPTOR_KEY_CONFIG": "/etc/keys.yaml"}, errs: []string{"DESCRIPTOR_KEY_CONFIG"}},
		{name: "refused_and_malformed", env: map[string]string{"DESCRIPTOR_KEY_CONFIG": "/k.yaml", "PORT": "abc"}, errs: []string{"DESCRIPTOR_KEY_CONFIG", "PORT"}},
		{name: "refused_and_invalid", env: map[string]string{"DESCRIPTOR_KEY_CONFIG": "/k.yaml", "BACKEND_TYPE": "foo"}, errs: []string{"DESCRIPTOR_KEY_CONFIG", "BACKEND_TYPE"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			s, err := Load()
			if len(tt.errs) == 0 {
				if err != nil {
					t.Fatalf("Load() = %v, want no error", err)
				}
			} else {
				if err == nil {
					t.Fatalf("Load() succeeded, want an error naming %v", tt.errs)
				}
				for _, w := range tt.errs {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("Load() error %q does not mention %q", err, w)
					}
				}
				return
			}
			var got []string
			for _, w := range s.Warnings() {
				got = append(got, w.Name)
				if w.Why == "" {
					t.Errorf("warning about %s without a reason", w.Name)
				}
			}
			if !reflect.DeepEqual(got, tt.warnings) {
				t.Errorf("Warnings() = %v, want %v", got, tt.warnings)
			}
		})
	}
}

// TestWarningsHideValues keeps credentials out of the logs: a value may
// hold them (tags, endpoints with tokens).
func TestWarningsHideValues(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "https://user:s3cr3t@otel:4318")
	s, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	w := s.Warnings()
	if len(w) != 1 || strings.Contains(fmt.Sprint(w), "s3cr3t") {
		t.Errorf("Warnings() = %v, want one, without the value", w)
	}
}

// envoyGatewayEnv is every variable Envoy Gateway's Deployment of the
// rate-limit service sets (internal/infrastructure/kubernetes/ratelimit/
// resource.go, both its statsd and its Prometheus-and-tracing variants).
var envoyGatewayEnv = []string{
	"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_IGNOREDOTFILES", "RUNTIME_WATCH_ROOT", "LOG_LEVEL",
	"USE_STATSD", "STATSD_PORT", "CONFIG_TYPE", "CONFIG_GRPC_XDS_SERVER_URL", "CONFIG_GRPC_XDS_NODE_ID",
	"GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_SERVER_TLS_CA_CERT",
	"CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
	"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "FORCE_START_WITHOUT_INITIAL_CONFIG", "REDIS_SOCKET_TYPE", "REDIS_URL",
	"REDIS_TLS", "REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "USE_PROMETHEUS", "PROMETHEUS_ADDR",
	"PROMETHEUS_MAPPER_YAML", "TRACING_ENABLED", "TRACING_SERVICE_NAME", "TRACING_SERVICE_NAMESPACE",
	"TRACING_SERVICE_INSTANCE_ID", "TRACING_SAMPLING_RATE", "OTEL_EXPORTER_OTLP_ENDPOINT",
}

// TestEnvoyGatewayGuide checks docs/ENVOY_GATEWAY.md against the settings
// table: a row for every variable Envoy Gateway sets, with the status
// docs/SETTINGS.md gives it (GRPC_SERVER_TLS_CA_CERT, which neither the
// anchor nor this service reads, is "not a setting").
func TestEnvoyGatewayGuide(t *testing.T) {
	settingsRows := readSettingsDoc(t)
	b, err := os.ReadFile("../../docs/ENVOY_GATEWAY.md")
	if err != nil {
		t.Fatal(err)
	}
	guide := map[string]string{}
	for n, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 4 {
			t.Errorf("ENVOY_GATEWAY.md:%d: want 4 cells: %s", n+1, line)
			continue
		}
		guide[strings.Trim(strings.TrimSpace(cells[0]), "`")] = strings.TrimSpace(cells[2])
	}
	for _, name := range envoyGatewayEnv {
		status, ok := guide[name]
		if !ok {
			t.Errorf("docs/ENVOY_GATEWAY.md has no row for %s, which Envoy Gateway sets", name)
			continue
		}
		want := "not a setting"
		if r, ok := settingsRows[name]; ok {
			want = r.status
		}
		if status != want {
			t.Errorf("docs/ENVOY_GATEWAY.md: %s: status %q, but docs/SETTINGS.md says %q", name, status, want)
		}
	}
	for name := range guide {
		if !slices.Contains(envoyGatewayEnv, name) {
			t.Errorf("docs/ENVOY_GATEWAY.md: %s is not a variable Envoy Gateway sets", name)
		}
	}
}
