//go:build unix

package listen

import "syscall"

// OpenFileLimit is the process's soft RLIMIT_NOFILE (which the Go runtime
// raises to the hard limit at startup), or 0 when it is unknown or
// unlimited.
func OpenFileLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	// Cur is signed on some systems, where -1 means unlimited.
	n := uint64(rl.Cur)
	if n >= 1<<40 {
		return 0
	}
	return n
}
