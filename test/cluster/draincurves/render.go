package draincurves

import (
	"fmt"
	"image/color"
	"io"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Render draws c as a PNG of width x height: one panel per query, a line
// per pod over the seconds since c.Start, and dashed lines where each
// pod's drain started (its series began) and where it was drained (its
// live connections reached zero for good).
func Render(c *Curves, w io.Writer, width, height vg.Length) error {
	pods := c.Pods()
	if len(pods) == 0 {
		return fmt.Errorf("no per-pod drain series of namespace %s between %v and %v", c.Namespace, c.Start, c.End)
	}
	plots := make([][]*plot.Plot, len(Panels))
	for i, panel := range Panels {
		p, err := panelPlot(c, i, panel, pods)
		if err != nil {
			return err
		}
		plots[i] = []*plot.Plot{p}
	}
	img := vgimg.New(width, height)
	dc := draw.New(img)
	t := draw.Tiles{Rows: len(Panels), Cols: 1, PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(4), PadY: vg.Points(8)}
	canvases := plot.Align(plots, t, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	_, err := vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}

func panelPlot(c *Curves, i int, panel Panel, pods []string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = panel.Title + " (" + c.Namespace + ")"
	p.X.Label.Text = "seconds since " + c.Start.UTC().Format("15:04:05")
	p.Y.Label.Text = panel.Unit
	p.Y.Min = 0
	p.Legend.Top = true
	for _, pts := range c.Series[i] {
		for _, pt := range pts {
			p.Y.Max = max(p.Y.Max, pt.V)
		}
	}
	p.Y.Max = max(p.Y.Max*1.1, 1)
	for k, pod := range pods {
		col := plotutil.Color(k)
		var xys plotter.XYs
		for _, pt := range c.Series[i][pod] {
			xys = append(xys, plotter.XY{X: pt.T.Sub(c.Start).Seconds(), Y: pt.V})
		}
		if len(xys) > 0 {
			l, err := plotter.NewLine(xys)
			if err != nil {
				return nil, err
			}
			l.Color, l.Width = col, vg.Points(1.5)
			p.Add(l)
			p.Legend.Add(pod, l)
		}
		first, _ := c.Span(pod)
		marks := []float64{first.Sub(c.Start).Seconds()}
		if d := c.Drained(pod); !d.IsZero() {
			marks = append(marks, d.Sub(c.Start).Seconds())
		}
		for _, at := range marks {
			m, err := plotter.NewLine(plotter.XYs{{X: at, Y: 0}, {X: at, Y: p.Y.Max}})
			if err != nil {
				return nil, err
			}
			m.Color, m.Dashes = faded(col), []vg.Length{vg.Points(3), vg.Points(3)}
			p.Add(m)
		}
	}
	p.X.Min, p.X.Max = 0, c.End.Sub(c.Start).Seconds()
	return p, nil
}

func faded(c color.Color) color.Color {
	r, g, b, _ := c.RGBA()
	return color.NRGBA{R: uint8(r >> 8), G: uint8(g >> 8), B: uint8(b >> 8), A: 140}
}
