//go:build !race

package memory

// raceEnabled: see race_on_test.go.
const raceEnabled = false
