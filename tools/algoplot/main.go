// Command algoplot draws how the four algorithms answer the same traffic:
// one trace (a limit of 10 a minute; a burst at the end of one window and
// the start of the next, then steady traffic above the limit) run through
// the limiter's pure functions on a fake clock, one row per algorithm, each
// request a green (admitted) or red (refused) tick. It writes a PNG:
//
//	go run ./tools/algoplot -o docs/algorithms.png
package main

import (
	"flag"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"

	"github.com/ratelimitd/ratelimit/tools/pixfont"
)

const (
	limit    = 10
	window   = time.Minute
	duration = 3 * time.Minute
	// from is where the drawing starts: nothing happens before.
	from = 40 * time.Second
)

// start is the start of a minute, so windows begin at 0 s, 60 s, ...
var start = time.Unix(1_699_920_000, 0)

// trace is the arrival time of each request (one hit each).
func trace() []time.Duration {
	var ts []time.Duration
	for i := range 10 { // the end of the first window
		ts = append(ts, 50*time.Second+time.Duration(i)*time.Second)
	}
	for i := range 10 { // the start of the second
		ts = append(ts, 60*time.Second+time.Duration(i)*time.Second)
	}
	for t := 72 * time.Second; t < duration; t += 4 * time.Second { // 15 a minute
		ts = append(ts, t)
	}
	return ts
}

// decision is one request's answer.
type decision struct {
	at        time.Duration
	allowed   bool
	remaining uint64
}

// simulate runs the trace through algorithm a's pure function.
func simulate(a rules.Algorithm, ts []time.Duration) []decision {
	op := limiter.Op{Algorithm: a, Limit: limit, Window: window, Hits: 1}
	var (
		fw      limiter.FixedWindowState
		fwStart int64
		sw      limiter.SlidingWindowState
		sl      limiter.SlidingLogState
		tb      limiter.TokenBucketState
	)
	out := make([]decision, 0, len(ts))
	for _, at := range ts {
		now := start.Add(at)
		var r limiter.Result
		switch a {
		case rules.FixedWindow:
			// A new window is a new cache key: a new count.
			if s := limiter.WindowStart(now, int64(window/time.Second)); s != fwStart {
				fw, fwStart = limiter.FixedWindowState{}, s
			}
			fw, r = limiter.FixedWindow(fw, now, op)
		case rules.SlidingWindow:
			sw, r = limiter.SlidingWindow(sw, now, op)
		case rules.SlidingLog:
			sl, r = limiter.SlidingLog(sl, now, op)
		case rules.TokenBucket:
			tb, r = limiter.TokenBucket(tb, now, op)
		}
		out = append(out, decision{at: at, allowed: r.Allowed, remaining: r.Remaining})
	}
	return out
}

var (
	white = color.RGBA{255, 255, 255, 255}
	ink   = color.RGBA{30, 30, 30, 255}
	grey  = color.RGBA{150, 150, 150, 255}
	light = color.RGBA{225, 225, 225, 255}
	green = color.RGBA{30, 150, 60, 255}
	red   = color.RGBA{210, 40, 40, 255}
	blue  = color.RGBA{60, 90, 200, 255}
)

const (
	width   = 1280
	left    = 300 // the label column
	right   = 40
	top     = 110
	rowH    = 110
	tickLen = 34
	scale   = 2 // font scale
)

func xOf(at time.Duration) int {
	return left + int(int64(width-left-right)*int64(at-from)/int64(duration-from))
}

func draw(rows []rules.Algorithm, results [][]decision, ts []time.Duration) *image.RGBA {
	height := top + rowH*(len(rows)+1) + 70
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	fillRect(img, 0, 0, width, height, white)

	pixfont.Draw(img, 20, 16, "The same traffic through each algorithm: limit 10 per minute", 3, ink)
	pixfont.Draw(img, 20, 52, "one a second at 50-69 s (across a window boundary), then one every 4 s (15 a minute)", scale, grey)
	fillRect(img, 20, 80, 10, 14, green)
	pixfont.Draw(img, 36, 80, "admitted", scale, ink)
	fillRect(img, 160, 80, 10, 14, red)
	pixfont.Draw(img, 176, 80, "refused", scale, ink)
	fillRect(img, 300, 86, 16, 2, blue)
	pixfont.Draw(img, 322, 80, "remaining after each request (0-10)", scale, ink)

	bottom := top + rowH*(len(rows)+1)
	// Window boundaries and a light grid every 10 s.
	for at := from; at <= duration; at += 10 * time.Second {
		c := light
		if at%window == 0 {
			c = grey
		}
		fillRect(img, xOf(at), top, 1, bottom-top, c)
		if at%window == 0 {
			label := fmt.Sprintf("%ds", int(at/time.Second))
			pixfont.Draw(img, xOf(at)-pixfont.Width(label, scale)/2, bottom+10, label, scale, ink)
		}
	}
	pixfont.Draw(img, 20, bottom+36, "time since the start of a minute, grey lines are the fixed windows", scale, grey)

	// The requests.
	y := top + rowH/2
	pixfont.Draw(img, 20, y-7, "requests", scale, ink)
	pixfont.Draw(img, 20, y+13, fmt.Sprintf("%d in all", len(ts)), scale, grey)
	fillRect(img, left, y, width-left-right, 1, grey)
	for _, at := range ts {
		fillRect(img, xOf(at)-1, y-tickLen, 2, tickLen, ink)
	}

	for i, a := range rows {
		y := top + rowH*(i+1) + rowH/2
		fillRect(img, 0, top+rowH*(i+1), width, 1, light)
		admitted := 0
		for _, d := range results[i] {
			if d.allowed {
				admitted++
			}
		}
		pixfont.Draw(img, 20, y-14, a.String(), scale, ink)
		pixfont.Draw(img, 20, y+6, fmt.Sprintf("%d admitted", admitted), scale, green)
		pixfont.Draw(img, 20, y+26, fmt.Sprintf("%d refused", len(results[i])-admitted), scale, red)
		fillRect(img, left, y, width-left-right, 1, grey)
		prevX, prevY := -1, 0
		for _, d := range results[i] {
			x := xOf(d.at)
			if d.allowed {
				fillRect(img, x-1, y-tickLen, 2, tickLen, green)
			} else {
				fillRect(img, x-1, y+1, 2, tickLen, red)
			}
			// Remaining, as a step line over the lane.
			ry := y - 2 - int(d.remaining)*(rowH/2-8)/limit
			if prevX >= 0 {
				fillRect(img, prevX, prevY, x-prevX, 2, blue)
				fillRect(img, x, min(prevY, ry), 2, abs(prevY-ry)+2, blue)
			}
			prevX, prevY = x, ry
		}
	}
	return img
}

func fillRect(img *image.RGBA, x, y, w, h int, c color.Color) {
	for yy := y; yy < y+h; yy++ {
		for xx := x; xx < x+w; xx++ {
			img.Set(xx, yy, c)
		}
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func main() {
	out := flag.String("o", "docs/algorithms.png", "the PNG file to write")
	flag.Parse()
	ts := trace()
	results := make([][]decision, len(rules.Algorithms))
	for i, a := range rules.Algorithms {
		results[i] = simulate(a, ts)
	}
	f, err := os.Create(*out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "algoplot:", err)
		os.Exit(1)
	}
	if err := png.Encode(f, draw(rules.Algorithms, results, ts)); err != nil {
		f.Close()
		fmt.Fprintln(os.Stderr, "algoplot:", err)
		os.Exit(1)
	}
	if err := f.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "algoplot:", err)
		os.Exit(1)
	}
}
