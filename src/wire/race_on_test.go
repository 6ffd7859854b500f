//go:build race

package wire

// raceEnabled: the race detector allocates on its own account, so
// allocation counts mean nothing under -race.
const raceEnabled = true
