//go:build !unix

package listen

// OpenFileLimit is 0 (unknown) where there is no RLIMIT_NOFILE.
func OpenFileLimit() uint64 { return 0 }
