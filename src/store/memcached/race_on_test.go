//go:build race

package memcached

// raceEnabled: the race detector makes sync.Pool drop items at random, so
// allocation counts mean nothing under -race.
const raceEnabled = true
