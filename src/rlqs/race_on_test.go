//go:build race

package rlqs_test

// raceEnabled: the race detector's shadow memory makes heap figures
// meaningless under -race; make allocs runs the heap tests without it.
const raceEnabled = true
