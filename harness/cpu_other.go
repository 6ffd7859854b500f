//go:build !unix

package harness

import "time"

// ProcessCPU returns false: the CPU time of this process is not measured
// on this platform.
func ProcessCPU() (time.Duration, bool) { return 0, false }
