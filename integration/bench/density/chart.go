package main

import (
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// series is one curve: a name and its value at each step.
type series struct {
	name string
	y    func(step) float64
}

// drawCharts draws latency and memory against the number of live
// sandboxes as prefix-latency.png and prefix-memory.png and returns their
// paths.
func drawCharts(res result, prefix string) ([]string, error) {
	mibOf := func(b int64) float64 { return float64(b) / (1 << 20) }
	charts := []struct {
		file, title, y string
		series         []series
	}{
		{"-latency.png", "Latency against live idle sandboxes", "ms", []series{
			{"hutch create → first output", func(s step) float64 { return s.CreateFirst }},
			{"runsc run → first output", func(s step) float64 { return s.RawRun }},
			{"hutch exec (median)", func(s step) float64 { return s.ExecID }},
			{"runsc exec (median)", func(s step) float64 { return s.RawExec }},
			{"hutch exec NAME", func(s step) float64 { return s.ExecName }},
			{"hutch ls -q", func(s step) float64 { return s.Ls }},
		}},
		{"-memory.png", "Host memory per idle sandbox", "MiB", []series{
			{"hutch: PSS (runsc processes)", func(s step) float64 { return mibOf(s.PSS) }},
			{"hutch: cgroup", func(s step) float64 { return mibOf(s.Cgroup) }},
			{"raw runsc: PSS", func(s step) float64 { return mibOf(s.RawPSS) }},
			{"raw runsc: cgroup", func(s step) float64 { return mibOf(s.RawCgroup) }},
		}},
	}
	var paths []string
	for _, c := range charts {
		p := plot.New()
		p.Title.Text = c.title
		p.X.Label.Text = "live idle sandboxes"
		p.Y.Label.Text = c.y
		p.Legend.Top = true
		p.Legend.Left = true
		var args []any
		top := 0.0
		for _, s := range c.series {
			xys := make(plotter.XYs, len(res.Steps))
			for i, st := range res.Steps {
				xys[i].X, xys[i].Y = float64(st.N), s.y(st)
				top = max(top, xys[i].Y)
			}
			args = append(args, s.name, xys)
		}
		if err := plotutil.AddLinePoints(p, args...); err != nil {
			return nil, err
		}
		// Room above the curves for the legend.
		p.Y.Min, p.Y.Max = 0, top*1.7
		path := prefix + c.file
		if err := p.Save(7*vg.Inch, 4.5*vg.Inch, path); err != nil {
			return nil, err
		}
		paths = append(paths, path)
	}
	return paths, nil
}
