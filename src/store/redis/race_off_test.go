//go:build !race

package redis

// raceEnabled: see race_on_test.go.
const raceEnabled = false
