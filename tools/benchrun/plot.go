package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"github.com/ratelimitd/ratelimit/tools/pixfont"
)

// The plot: two panels of grouped bars, throughput above and p99 below, one
// group per scenario and one bar per store; across each bar a gray line
// marks the median of the no-op runs paired with it (its ceiling).

var (
	white     = color.RGBA{255, 255, 255, 255}
	black     = color.RGBA{30, 30, 30, 255}
	gridGray  = color.RGBA{225, 225, 225, 255}
	axisGray  = color.RGBA{120, 120, 120, 255}
	seriesRGB = map[string]color.RGBA{
		"no-op":         {160, 160, 160, 255},
		"memory":        {66, 133, 244, 255},
		"redis":         {219, 68, 55, 255},
		"redis-cluster": {244, 160, 0, 255},
		"memcache":      {15, 157, 88, 255},
	}
	seriesOrder = []string{"memory", "redis", "redis-cluster", "memcache"}
	groupLabels = map[string]string{
		"c16": "A C=16", "c64": "A C=64", "c256": "A C=256", "hot": "B HOT", "hot+nc": "B HOT+NC",
		"chain": "C CHAIN", "fixed": "D FIXED", "sliding": "D SLIDING", "log": "D LOG", "bucket": "D BUCKET",
	}
)

const (
	barW     = 14
	barGap   = 2
	groupPad = 18
	leftM    = 64
	rightM   = 16
	panelH   = 220
)

// plotGroups returns the ids of the scenarios with a measured row, in the
// order of storeScenarios (the ceiling shares the ids of scenario (a)), and
// the stores with a measured row, in legend order.
func plotGroups(rep *report) (ids, stores []string) {
	seenID := map[string]bool{}
	seenStore := map[string]bool{}
	for _, rw := range rep.rows {
		if rw.skip == "" {
			seenID[rw.sc.id] = true
			seenStore[rw.store] = true
		}
	}
	for _, sc := range storeScenarios {
		if seenID[sc.id] {
			ids = append(ids, sc.id)
		}
	}
	for _, s := range seriesOrder {
		if seenStore[s] {
			stores = append(stores, s)
		}
	}
	return ids, stores
}

// renderPlot draws the report's plot.
func renderPlot(rep *report) *image.RGBA {
	ids, stores := plotGroups(rep)
	const title = "RATELIMIT: REQUESTS/S AND P99 PER STORE AND SCENARIO"
	groupW := max(len(stores), 1)*(barW+barGap) + groupPad
	for _, label := range groupLabels {
		groupW = max(groupW, pixfont.Width(label, 1)+12)
	}
	const ceilLabel = "no-op, paired"
	legendW := 14 + pixfont.Width(ceilLabel, 1)
	for _, s := range stores {
		legendW += 14 + pixfont.Width(s, 1) + 16
	}
	width := max(leftM+len(ids)*groupW+rightM, leftM+pixfont.Width(title, 2)+rightM, leftM+legendW+rightM)
	const top = 60 // title and legend
	height := top + 2*(panelH+50) - 20
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	draw.Draw(img, img.Bounds(), image.NewUniform(white), image.Point{}, draw.Src)

	pixfont.Draw(img, leftM, 10, title, 2, black)
	x := leftM
	for _, s := range stores {
		fill(img, x, 36, 10, 10, seriesRGB[s])
		pixfont.Draw(img, x+14, 38, s, 1, black)
		x += 14 + pixfont.Width(s, 1) + 16
	}
	fill(img, x, 40, 10, 2, seriesRGB["no-op"])
	pixfont.Draw(img, x+14, 38, ceilLabel, 1, black)

	// value returns a store's median and the median of its paired no-op
	// runs, NaN where not measured.
	value := func(store, id string, p99 bool) (v, ceil float64) {
		for _, rw := range rep.rows {
			if rw.store == store && rw.sc.id == id && rw.skip == "" && rw.variant == "" {
				if p99 {
					ceil = math.NaN()
					if rw.ceilP99 > 0 {
						ceil = float64(rw.ceilP99) / 1e6
					}
					return float64(rw.p99) / 1e6, ceil
				}
				return rw.rps, rw.ceilRPS
			}
		}
		return math.NaN(), math.NaN()
	}
	panel := func(y0 int, title string, p99 bool, format func(float64) string) {
		maxV := 0.0
		for _, id := range ids {
			for _, s := range stores {
				v, ceil := value(s, id, p99)
				for _, x := range []float64{v, ceil} {
					if !math.IsNaN(x) {
						maxV = max(maxV, x)
					}
				}
			}
		}
		maxV, step := niceScale(maxV)
		pixfont.Draw(img, leftM, y0, title, 1, black)
		plotTop, plotBottom := y0+14, y0+14+panelH-30
		ticks := int(math.Round(maxV / step))
		for i := 0; i <= ticks; i++ {
			v := step * float64(i)
			y := plotBottom - int(float64(plotBottom-plotTop)*float64(i)/float64(ticks))
			fill(img, leftM, y, width-leftM-rightM, 1, gridGray)
			label := format(v)
			pixfont.Draw(img, leftM-6-pixfont.Width(label, 1), y-3, label, 1, axisGray)
		}
		for gi, id := range ids {
			barsW := len(stores)*(barW+barGap) - barGap
			gx := leftM + gi*groupW + (groupW-barsW)/2
			for si, s := range stores {
				v, ceil := value(s, id, p99)
				if math.IsNaN(v) || maxV == 0 {
					continue
				}
				bx := gx + si*(barW+barGap)
				h := int(math.Round(float64(plotBottom-plotTop) * v / maxV))
				fill(img, bx, plotBottom-h, barW, h, seriesRGB[s])
				if !math.IsNaN(ceil) {
					// Drawn over the bar when the bar is taller (noise).
					y := plotBottom - int(math.Round(float64(plotBottom-plotTop)*ceil/maxV))
					fill(img, bx-1, y-1, barW+2, 3, seriesRGB["no-op"])
				}
			}
			label := groupLabels[id]
			if label == "" {
				label = id
			}
			cx := leftM + gi*groupW + groupW/2
			pixfont.Draw(img, cx-pixfont.Width(label, 1)/2, plotBottom+6, label, 1, black)
		}
		fill(img, leftM, plotBottom, width-leftM-rightM, 1, axisGray)
	}
	panel(top, "REQUESTS/S (MEDIAN)", false, func(v float64) string {
		if v >= 1000 {
			return strconv.FormatFloat(math.Round(v)/1000, 'f', -1, 64) + "K"
		}
		return strconv.FormatFloat(v, 'f', -1, 64)
	})
	panel(top+panelH+50, "P99 LATENCY, MS (MEDIAN)", true, func(v float64) string {
		return strconv.FormatFloat(v, 'g', 4, 64)
	})
	return img
}

// niceScale returns an axis top above v (with 5% headroom) and a tick step
// of 1, 2 or 5 times a power of ten, with at most 5 steps.
func niceScale(v float64) (top, step float64) {
	if v <= 0 || math.IsNaN(v) {
		return 1, 0.25
	}
	v *= 1.05
	p := math.Pow(10, math.Floor(math.Log10(v/5)))
	for _, m := range []float64{1, 2, 5, 10} {
		step = m * p
		if math.Ceil(v/step) <= 5 {
			break
		}
	}
	return math.Ceil(v/step) * step, step
}

func fill(img *image.RGBA, x, y, w, h int, c color.Color) {
	draw.Draw(img, image.Rect(x, y, x+w, y+h), image.NewUniform(c), image.Point{}, draw.Src)
}

func writePlot(path string, rep *report) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("benchrun: %w", err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("benchrun: %w", err)
	}
	if err := png.Encode(f, renderPlot(rep)); err != nil {
		f.Close()
		return fmt.Errorf("benchrun: plot: %w", err)
	}
	return f.Close()
}
