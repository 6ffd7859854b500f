//go:build !unix

package harness

import "os"

// lockFile does nothing: file locks are not used on this platform.
func lockFile(*os.File) error { return nil }
