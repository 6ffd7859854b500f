package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"github.com/ratelimitd/ratelimit/src/capture"
	"github.com/ratelimitd/ratelimit/src/replay"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// The exit codes of -replay, as -diff's.
const (
	replaySame    = 0
	replayChanged = 1
	replayTrouble = 2
)

// replayFlags are -replay's.
type replayFlags struct {
	capture, against string
	json             bool
	top, maxKeys     int
	maxKeyBytes      int64
	memoryMaxBytes   int64
	stopIncrement    bool
	shadowMode       bool
	quotaMode        bool
}

func (f *replayFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.capture, "replay", "", "replay this capture (the NDJSON of GET /api/v1/capture; - for stdin) against the rules of -config_dir")
	fs.StringVar(&f.against, "against", "", "with -replay: compare with the rules of this directory (default: with the answers in the capture)")
	fs.BoolVar(&f.json, "json", false, "with -replay or -explain: write the report as JSON")
	fs.IntVar(&f.top, "top", replay.DefaultTop, "with -replay: keys listed per rule")
	fs.IntVar(&f.maxKeys, "max_keys", replay.DefaultMaxKeys, "with -replay: keys whose refusals are counted, per rule set")
	fs.Int64Var(&f.maxKeyBytes, "max_key_bytes", replay.DefaultMaxKeyBytes, "with -replay: bytes of the keys whose refusals are counted, per rule set")
	fs.Int64Var(&f.memoryMaxBytes, "memory_max_bytes", replay.DefaultMemoryMaxBytes, "with -replay: each rule set's memory store ceiling, as MEMORY_MAX_BYTES (-1: none)")
	fs.BoolVar(&f.stopIncrement, "stop_cache_key_increment_when_overlimit", false, "with -replay: as STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true")
	fs.BoolVar(&f.shadowMode, "shadow_mode", false, "with -replay: as SHADOW_MODE=true")
	fs.BoolVar(&f.quotaMode, "quota_mode", false, "with -replay: as QUOTA_MODE=true")
}

// memoryLimitSlack is what the Go memory limit of a replay leaves beside
// what the replay holds: the runtime's own (stacks, the collector's
// metadata) and room for the garbage of a few chunks between collections.
const memoryLimitSlack = 64 << 20

// runReplay replays the capture against the rules of newDir (and of
// f.against) and prints the report.
func runReplay(f replayFlags, newDir string, load func(string) (int, *rules.Config, error), stdout, stderr io.Writer) int {
	cfg := replay.Config{
		NewName: newDir, OldName: f.against, Top: f.top, MaxKeys: f.maxKeys, MaxKeyBytes: f.maxKeyBytes, MemoryMaxBytes: f.memoryMaxBytes,
		StopIncrementWhenOverLimit: f.stopIncrement, GlobalShadowMode: f.shadowMode, GlobalQuotaMode: f.quotaMode,
	}
	cfgs, ok := loadDirs(load, stderr, newDir, f.against)
	if !ok {
		return replayTrouble
	}
	cfg.New, cfg.Old = cfgs[0], cfgs[1]
	if os.Getenv("GOGC") == "" {
		// A replay is a batch job that makes garbage at every request:
		// collecting less often makes it a third faster for a few times
		// the heap (docs/BENCHMARKS.md, "Replay"). GOGC overrides it.
		debug.SetGCPercent(400)
	}
	if b := cfg.MemoryBound(); b > 0 && os.Getenv("GOMEMLIMIT") == "" {
		// What the replay holds is bounded (docs/CHANGING_LIMITS.md,
		// "Replay"); the collector runs more often near it instead of
		// letting the garbage take four times as much (GOGC above).
		debug.SetMemoryLimit(b + memoryLimitSlack)
	}
	in := os.Stdin
	if f.capture != "-" {
		file, err := os.Open(f.capture)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return replayTrouble
		}
		defer file.Close()
		in = file
	}
	rd, err := capture.NewReader(in)
	if err == nil {
		var rep *replay.Report
		if rep, err = replay.Run(context.Background(), rd, cfg); err == nil {
			return writeReport(rep, f.json, stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "%s: %v\n", f.capture, err)
	return replayTrouble
}

func writeReport(rep *replay.Report, asJSON bool, stdout, stderr io.Writer) int {
	if err := writeOut(rep, asJSON, stdout); err != nil {
		fmt.Fprintln(stderr, err)
		return replayTrouble
	}
	if rep.Differs() {
		return replayChanged
	}
	return replaySame
}

// writeOut writes v to w as indented JSON, or as its text.
func writeOut(v interface{ WriteText(io.Writer) error }, asJSON bool, w io.Writer) error {
	if !asJSON {
		return v.WriteText(w)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
