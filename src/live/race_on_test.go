//go:build race

package live

// raceEnabled: the race detector makes allocation counts meaningless and
// multiplies the cost of the million-key test.
const raceEnabled = true
