package main

import (
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// point is one measured size: MiB, and a median in milliseconds for each
// curve that was measured at it.
type point struct {
	mib    int
	values map[string]float64
}

// curves are the points of one chart, in order of size.
type curves struct {
	file, title, x string
	names          []string // curve names, in legend order
	points         []point
}

// add records the medians measured at mib.
func (c *curves) add(mib int, values map[string]float64) {
	c.points = append(c.points, point{mib: mib, values: values})
}

// draw saves the chart as dir/c.file (PNG) and returns its path; it
// draws nothing for fewer than two sizes.
func (c *curves) draw(dir string) (string, error) {
	if len(c.points) < 2 {
		return "", nil
	}
	p := plot.New()
	p.Title.Text = c.title
	p.X.Label.Text = c.x
	p.Y.Label.Text = "ms (median)"
	p.Legend.Top = true
	p.Legend.Left = true
	var args []any
	top := 0.0
	for _, name := range c.names {
		var xys plotter.XYs
		for _, pt := range c.points {
			if v, ok := pt.values[name]; ok {
				xys = append(xys, plotter.XY{X: float64(pt.mib), Y: v})
				top = max(top, v)
			}
		}
		if len(xys) > 0 {
			args = append(args, name, xys)
		}
	}
	if err := plotutil.AddLinePoints(p, args...); err != nil {
		return "", err
	}
	// Room above the curves for the legend.
	p.X.Min, p.Y.Min, p.Y.Max = 0, 0, top*1.6
	path := filepath.Join(dir, c.file)
	if err := p.Save(7*vg.Inch, 4.5*vg.Inch, path); err != nil {
		return "", err
	}
	return path, nil
}
