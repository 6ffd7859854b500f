//go:build !unix

package server

// openFileLimit is 0 (unknown) where there is no RLIMIT_NOFILE.
func openFileLimit() uint64 { return 0 }
