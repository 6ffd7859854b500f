package redis

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var scriptsDir = flag.String("scripts-dir", "", "TestWriteScripts writes the Lua scripts into this `folder` (for scripts/bench-lua.sh)")

// TestWriteScripts writes the store's Lua scripts to -scripts-dir, so that
// redis-benchmark can run them (scripts/bench-lua.sh); without the flag it
// does nothing.
func TestWriteScripts(t *testing.T) {
	if *scriptsDir == "" {
		t.Skip("no -scripts-dir")
	}
	files := map[string]string{
		"decide.lua":         decideLua,
		"sliding_window.lua": leanSlidingWindowLua,
		"sliding_log.lua":    leanSlidingLogLua,
		"token_bucket.lua":   leanTokenBucketLua,
	}
	for name, src := range files {
		if err := os.WriteFile(filepath.Join(*scriptsDir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
