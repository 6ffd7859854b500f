// Package harness starts every process the tests run against, real ones,
// on free loopback ports, and stops them when the test ends: one file per
// process.
//
//   - redis.go, redis_sentinel.go, redis_cluster.go: redis-server alone
//     (optionally with TLS or a password), a Sentinel group, a Cluster
//   - memcached.go: memcached, optionally with TLS; fakememcached.go, a
//     fake that answers what a test scripts
//   - twemproxy.go: nutcracker in front of Redis servers
//   - proxy.go: a TCP proxy that puts network faults between a client and
//     a server
//   - envoy.go, envoy_bootstrap.go: real Envoy and the bootstraps it runs
//   - xds.go: go-control-plane's xDS management server
//   - otlp.go: an OpenTelemetry trace receiver
//   - silent.go: a server that accepts and never answers, and a port
//     where nothing listens
//   - cert.go: the one certificate helper (CAs, certificates, the PEM files
//     of a TLS server and its client, a Kubernetes-like secret directory)
//
// Start* functions take a testing.TB, fail it when the process cannot
// start and stop the process in its cleanup; Launch* functions take a
// directory and return an error, for the tools (benchmarks, the soak) that
// run outside a test. Underneath, process.go is the generic launcher the
// tests do not use directly: it runs a program, probes it until it answers
// as the process it started, retries on a new port if another took the
// port first, and kills it. The rest are what the tests of those processes
// share: WaitFor and CheckGoroutines, CPUMeter, LockLoad, HealthTold and
// ServeLoopback.
//
// It is for tests and tools only: the service never imports it
// (scripts/check-imports.sh), and the service's module requires nothing for
// it alone but go-control-plane, whose xDS server xds.go runs
// (TestModuleRequiresWhatTheServiceUses).
package harness
