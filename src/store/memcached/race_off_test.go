//go:build !race

package memcached

// raceEnabled: see race_on_test.go.
const raceEnabled = false
