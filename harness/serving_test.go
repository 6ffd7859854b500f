package harness

import "testing"

// TestParseServing reads the addresses from the "serving" line in text
// and in JSON, past other lines, and reports when there is none.
func TestParseServing(t *testing.T) {
	want := Serving{GRPC: "127.0.0.1:1", HTTP: "127.0.0.1:2", Debug: "127.0.0.1:3", Prometheus: "127.0.0.1:4"}
	for name, logs := range map[string]string{
		"text": "time=x level=WARN msg=\"the store does not answer yet\"\n" +
			"time=x level=WARN msg=serving grpc=127.0.0.1:1 grpc_tls=false http=127.0.0.1:2 debug=127.0.0.1:3 prometheus=127.0.0.1:4 backend=memory\n",
		"json": `{"msg":"other"}` + "\n" +
			`{"time":"x","level":"WARN","msg":"serving","grpc":"127.0.0.1:1","http":"127.0.0.1:2","debug":"127.0.0.1:3","prometheus":"127.0.0.1:4"}` + "\n",
		"anchor's json": `{"@message":"serving","grpc":"127.0.0.1:1","http":"127.0.0.1:2","debug":"127.0.0.1:3","prometheus":"127.0.0.1:4"}`,
	} {
		if got, ok := ParseServing(logs); !ok || got != want {
			t.Errorf("%s: ParseServing = %+v, %v; want %+v, true", name, got, ok, want)
		}
	}
	if got, ok := ParseServing("time=x level=WARN msg=\"cannot start\"\n"); ok {
		t.Errorf("no serving line: ParseServing = %+v, true; want false", got)
	}
}
