//go:build !race

package rlqs_test

// raceEnabled: see race_on_test.go.
const raceEnabled = false
