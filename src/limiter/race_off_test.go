//go:build !race

package limiter

// raceEnabled: see race_on_test.go.
const raceEnabled = false
