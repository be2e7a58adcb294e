package bench

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// Series is one line of a chart.
type Series struct {
	Name string
	X, Y []float64
}

// Chart is a line chart with a log or linear x axis, written as SVG.
type Chart struct {
	Title, XLabel, YLabel string
	LogX                  bool
	Series                []Series
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"}

// WriteSVG writes c as a standalone SVG document (axes, ticks, grid, legend).
func (c *Chart) WriteSVG(w io.Writer) error {
	const (
		W, H                     = 640.0, 400.0
		left, right, top, bottom = 70.0, 150.0, 40.0, 50.0
	)
	pw, ph := W-left-right, H-top-bottom
	xmin, xmax, ymax := math.Inf(1), math.Inf(-1), 0.0
	for _, s := range c.Series {
		for i, x := range s.X {
			if c.LogX && x <= 0 {
				continue
			}
			xmin, xmax = math.Min(xmin, x), math.Max(xmax, x)
			if !math.IsNaN(s.Y[i]) {
				ymax = math.Max(ymax, s.Y[i])
			}
		}
	}
	if math.IsInf(xmin, 0) {
		xmin, xmax = 1, 10
	}
	if xmax <= xmin {
		xmax = xmin * 10
		if !c.LogX {
			xmax = xmin + 1
		}
	}
	ystep := niceStep(ymax / 5)
	ytop := math.Max(ystep, math.Ceil(ymax/ystep)*ystep)
	var fx func(float64) float64
	var xticks []float64
	if c.LogX {
		lo, hi := math.Floor(math.Log10(xmin)), math.Ceil(math.Log10(xmax))
		if hi == lo {
			hi++
		}
		fx = func(x float64) float64 { return left + pw*(math.Log10(x)-lo)/(hi-lo) }
		for e := lo; e <= hi; e++ {
			xticks = append(xticks, math.Pow(10, e))
		}
	} else {
		step := niceStep((xmax - xmin) / 5)
		lo := math.Floor(xmin/step) * step
		hi := math.Ceil(xmax/step) * step
		fx = func(x float64) float64 { return left + pw*(x-lo)/(hi-lo) }
		for x := lo; x <= hi+step/2; x += step {
			xticks = append(xticks, x)
		}
	}
	fy := func(y float64) float64 { return top + ph*(1-y/ytop) }

	var b strings.Builder
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="sans-serif" font-size="12">
<rect width="100%%" height="100%%" fill="white"/>
<text x="%g" y="22" font-size="15" text-anchor="middle">%s</text>
`, W, H, W, H, left+pw/2, esc(c.Title))
	for _, x := range xticks {
		X := fx(x)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="#ddd"/><text x="%.1f" y="%g" text-anchor="middle">%s</text>
`, X, top, X, top+ph, X, top+ph+16, fmtNum(x))
	}
	for y := 0.0; y <= ytop+ystep/2; y += ystep {
		Y := fy(y)
		fmt.Fprintf(&b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#ddd"/><text x="%g" y="%.1f" text-anchor="end">%s</text>
`, left, Y, left+pw, Y, left-6, Y+4, fmtNum(y))
	}
	fmt.Fprintf(&b, `<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="black"/>
<text x="%g" y="%g" text-anchor="middle">%s</text>
<text x="18" y="%g" text-anchor="middle" transform="rotate(-90 18 %g)">%s</text>
`, left, top, pw, ph, left+pw/2, H-12, esc(c.XLabel), top+ph/2, top+ph/2, esc(c.YLabel))
	for i, s := range c.Series {
		col := palette[i%len(palette)]
		var pts []string
		for j, x := range s.X {
			if (c.LogX && x <= 0) || math.IsNaN(s.Y[j]) {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", fx(x), fy(s.Y[j])))
		}
		if len(pts) > 0 {
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>
`, col, strings.Join(pts, " "))
			for _, p := range pts {
				xy := strings.Split(p, ",")
				fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`, xy[0], xy[1], col)
			}
			b.WriteString("\n")
		}
		ly := top + 10 + float64(i)*18
		fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="%s" stroke-width="2"/><text x="%g" y="%g">%s</text>
`, left+pw+10, ly, left+pw+30, ly, col, left+pw+35, ly+4, esc(s.Name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// niceStep rounds v up to 1, 2 or 5 × a power of ten.
func niceStep(v float64) float64 {
	if v <= 0 || math.IsNaN(v) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func fmtNum(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e9 {
		return fmt.Sprintf("%.0f", v)
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", v), "0"), ".")
}

func esc(s string) string {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;")
	return r.Replace(s)
}
