package harness

import (
	"testing"
	"time"
)

// CPUMeter measures the CPU time a benchmark uses in this process (the
// callers and the store) and in the server it runs against. Make one with
// StartCPU before b.ResetTimer and call Report after b.StopTimer. A
// CPUMeter is not safe for concurrent use; its zero value reports nothing.
type CPUMeter struct {
	serverCPU    func() (time.Duration, bool)
	serverUnit   string
	self, server time.Duration
	ok           bool
}

// StartCPU returns a CPUMeter that starts from the CPU time used so far by
// this process (ProcessCPU) and by the server. serverCPU returns the
// server's total CPU time, or false if it cannot tell; serverUnit names the
// metric Report gives it, such as "redis-cpu-ns/op".
func StartCPU(serverCPU func() (time.Duration, bool), serverUnit string) *CPUMeter {
	m := &CPUMeter{serverCPU: serverCPU, serverUnit: serverUnit}
	var okSelf, okServer bool
	m.self, okSelf = ProcessCPU()
	m.server, okServer = serverCPU()
	m.ok = okSelf && okServer
	return m
}

// Report reports cpu-ns/op, the CPU time of this process per op since
// StartCPU, and the server's under the meter's server unit. It reports
// neither if either clock could not be read, at the start or now, or if
// b.N is 0.
func (m *CPUMeter) Report(b *testing.B) {
	b.Helper()
	if m.serverCPU == nil {
		return
	}
	self, okSelf := ProcessCPU()
	server, okServer := m.serverCPU()
	if !m.ok || !okSelf || !okServer || b.N == 0 {
		return
	}
	b.ReportMetric(float64(self-m.self)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(server-m.server)/float64(b.N), m.serverUnit)
}
