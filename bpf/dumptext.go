package bpf

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteText writes the dump as `draind bpf dump` prints it: the frontends,
// the backend sets, the drain entries with their statistics and the
// outcome counters, each a table; times relative to now.
func (d *Dump) WriteText(w io.Writer, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "FRONTEND\tSERVICE-PORT\tSTEER\tEXPIRES\n")
	for _, f := range d.Frontends {
		steer := "yes"
		if f.NoSteer {
			steer = "no"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", f.Key, f.Service, steer, Age(now, f.Expires))
	}
	fmt.Fprintf(tw, "\nSERVICE-PORT\tBACKENDS\tEXPIRES\n")
	for _, b := range d.Backends {
		var s []string
		for _, ap := range b.Backends {
			s = append(s, ap.String())
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\n", b.Service, strings.Join(s, ","), Age(now, b.Expires))
	}
	fmt.Fprintf(tw, "\nDRAINING\tPOLICY\tSERVICE-PORT\tEXPIRES\tSYNS\tSTEERED\tREFUSED\tPASSED\n")
	for _, dr := range d.Drains {
		st := d.Stats[dr.Key]
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%d\t%d\t%d\n", dr.Key, dr.Policy, dr.Service, Age(now, dr.Expires), st.SYNs, st.Steered, st.Refused, st.Passed)
	}
	fmt.Fprintf(tw, "\nCOUNTER\tIPV4\tIPV6\n")
	for o := Outcome(0); int(o) < NumOutcomes; o++ {
		fmt.Fprintf(tw, "%s\t%d\t%d\n", o, d.Counters.Get(o, IPv4), d.Counters.Get(o, IPv6))
	}
	return tw.Flush()
}

// Age is how draind's text output shows time t seen at now: "-" for none,
// "in 1m05s" ahead, "3.2s" behind.
func Age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	if d < 0 {
		return "in " + ShortDuration(-d)
	}
	return ShortDuration(d)
}

// ShortDuration is a duration in draind's text output: "250ms", "3.2s",
// "1m05s", then minutes.
func ShortDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return d.Round(time.Minute).String()
}
