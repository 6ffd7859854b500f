//go:build !race

package service_test

// raceEnabled: see race_on_test.go.
const raceEnabled = false
