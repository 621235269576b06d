package scenario

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Result is what one variant measured.
type Result struct {
	Variant      Variant
	ControlPlane string
	Config       Config
	// Clients: ClusterIP, stale registry, keep-alive.
	Clients []ClientResult
	// Pods are the replaced pods, in rollout order.
	Pods []PodResult
	// RolloutStart is when the first new pod was started; RolloutEnd when
	// the last old pod was gone.
	RolloutStart, RolloutEnd time.Time
}

// ClientResult is one client's tally over the whole run (warm-up, rollout
// and tail).
type ClientResult struct {
	Name   string
	Target string
	// OK counts successful requests (for the ClusterIP and stale-registry
	// clients each is a new connection).
	OK int
	// Fails counts failed requests (and failed reconnects of the keep-alive
	// client) by kind: refused, reset, eof, timeout, unreachable, ...
	Fails map[string]int
	// Last is when a new connection last landed on each server (pod name).
	Last map[string]time.Time
}

// Failed is the number of failed requests.
func (c ClientResult) Failed() int {
	n := 0
	for _, v := range c.Fails {
		n += v
	}
	return n
}

// Attempts is successes plus failures.
func (c ClientResult) Attempts() int { return c.OK + c.Failed() }

// FailKinds spells the failures by kind, most frequent first.
func (c ClientResult) FailKinds() string {
	kinds := slices.Collect(maps.Keys(c.Fails))
	slices.SortFunc(kinds, func(a, b string) int {
		return cmp.Or(cmp.Compare(c.Fails[b], c.Fails[a]), cmp.Compare(a, b))
	})
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %s", k, thousands(c.Fails[k])))
	}
	return strings.Join(parts, ", ")
}

// PodResult is what happened to one replaced pod.
type PodResult struct {
	Name, Node string
	IP         netip.Addr
	// Deleted: the graceful delete call; Stopped: its server stopped;
	// Gone: the pod object removed.
	Deleted, Stopped, Gone time.Time
	// PreStop is the preStop's outcome ("slept", "drained", ...; "" without
	// one) and PreStopTook its duration.
	PreStop     string
	PreStopTook time.Duration
	// SYNsAfterStop counts new connections (SYNs) that reached the pod
	// after its server stopped and before its sandbox went: each was
	// refused.
	SYNsAfterStop int
}

// Rollout is the time from the first new pod to the last old pod gone.
func (r *Result) Rollout() time.Duration { return r.RolloutEnd.Sub(r.RolloutStart) }

// Client returns the named client's tally.
func (r *Result) Client(name string) (ClientResult, bool) {
	for _, c := range r.Clients {
		if c.Name == name {
			return c, true
		}
	}
	return ClientResult{}, false
}

// FailedTotal sums failures over the clients.
func (r *Result) FailedTotal() int {
	n := 0
	for _, c := range r.Clients {
		n += c.Failed()
	}
	return n
}

// SYNsAfterStop sums, over the replaced pods, the SYNs that reached a pod
// after its server stopped.
func (r *Result) SYNsAfterStop() int {
	n := 0
	for _, p := range r.Pods {
		n += p.SYNsAfterStop
	}
	return n
}

// LastLanding is, over the replaced pods, the longest time from a pod's
// delete call to the last new connection of client that landed on it;
// ok is false if none landed on any after its delete.
func (r *Result) LastLanding(client string) (d time.Duration, ok bool) {
	c, found := r.Client(client)
	if !found {
		return 0, false
	}
	for _, p := range r.Pods {
		last, seen := c.Last[p.Name]
		if !seen || !last.After(p.Deleted) {
			continue
		}
		if x := last.Sub(p.Deleted); !ok || x > d {
			d, ok = x, true
		}
	}
	return d, ok
}

// PreStopRange is the shortest and longest preStop of the replaced pods.
func (r *Result) PreStopRange() (lo, hi time.Duration, outcomes []string) {
	for i, p := range r.Pods {
		if i == 0 || p.PreStopTook < lo {
			lo = p.PreStopTook
		}
		hi = max(hi, p.PreStopTook)
		if p.PreStop != "" && !slices.Contains(outcomes, p.PreStop) {
			outcomes = append(outcomes, p.PreStop)
		}
	}
	return lo, hi, outcomes
}

// WriteTable prints the results side by side, one column per variant.
func WriteTable(w io.Writer, results []*Result) error {
	if len(results) == 0 {
		return nil
	}
	cfg := results[0].Config
	fmt.Fprintf(w, "control plane: %s\n", results[0].ControlPlane)
	fmt.Fprintf(w, "%d pods on 2 nodes replaced one by one (maxSurge 1, maxUnavailable 0); clients on a third node; %v of traffic after the rollout\n",
		cfg.Replicas, cfg.Tail)
	fmt.Fprintf(w, "preStop: sleep %v | draind /v1/offline?wait=%v; a stopped pod's sandbox goes %v after its server\n\n",
		cfg.SleepPreStop, cfg.OfflineWait, cfg.Teardown)

	t := &table{}
	row := func(label string, cell func(*Result) string) {
		cells := []string{label}
		for _, r := range results {
			cells = append(cells, cell(r))
		}
		t.rows = append(t.rows, cells)
	}
	section := func(label string) { t.rows = append(t.rows, []string{label}) }
	row("", func(r *Result) string { return r.Variant.Label() })
	row("rollout: first new pod → last old pod gone", func(r *Result) string { return secs(r.Rollout()) })
	section("failed requests / requests")
	for _, c := range []struct{ name, label string }{
		{ClientClusterIP, fmt.Sprintf("  ClusterIP client (new connection every %v)", cfg.Interval)},
		{ClientStale, fmt.Sprintf("  stale-registry client (old pod IP, every %v)", cfg.Interval)},
		{ClientKeepAlive, fmt.Sprintf("  keep-alive client (request every %v)", cfg.KeepAliveEvery)},
	} {
		row(c.label, func(r *Result) string {
			cr, ok := r.Client(c.name)
			if !ok {
				return "-"
			}
			return thousands(cr.Failed()) + " / " + thousands(cr.Attempts())
		})
	}
	row("new connections reaching a stopped pod (SYNs)", func(r *Result) string { return thousands(r.SYNsAfterStop()) })
	section("delete → last new connection on the old pod")
	for _, c := range []struct{ name, label string }{
		{ClientClusterIP, "  ClusterIP client (longest of the pods)"},
		{ClientStale, "  stale-registry client"},
		{ClientKeepAlive, "  keep-alive client (reconnects)"},
	} {
		row(c.label, func(r *Result) string {
			d, ok := r.LastLanding(c.name)
			if !ok {
				return "none"
			}
			return secs(d)
		})
	}
	row("preStop per pod (shortest - longest)", func(r *Result) string {
		lo, hi, outcomes := r.PreStopRange()
		if len(outcomes) == 0 {
			return "none"
		}
		return fmt.Sprintf("%s - %s %s", secs(lo), secs(hi), strings.Join(outcomes, ","))
	})
	if err := t.write(w); err != nil {
		return err
	}
	kinds := &table{left: true}
	kinds.rows = append(kinds.rows, []string{"variant", "failures by kind"})
	for _, r := range results {
		var parts []string
		for _, c := range r.Clients {
			if c.Failed() > 0 {
				parts = append(parts, c.Name+": "+c.FailKinds())
			}
		}
		if len(parts) == 0 {
			parts = []string{"none"}
		}
		kinds.rows = append(kinds.rows, []string{r.Variant.Label(), strings.Join(parts, "; ")})
	}
	fmt.Fprintln(w)
	if err := kinds.write(w); err != nil {
		return err
	}
	return nil
}

// table prints rows as "| a | b |" lines with aligned columns: the first
// left-aligned, the others right-aligned (all left with left set). A row
// with one cell is a section heading.
type table struct {
	rows [][]string
	left bool
}

func (t *table) write(w io.Writer) error {
	cols := 0
	for _, r := range t.rows {
		cols = max(cols, len(r))
	}
	widths := make([]int, cols)
	for _, r := range t.rows {
		for i, c := range r {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	var b strings.Builder
	for _, r := range t.rows {
		b.WriteString("|")
		for i := range cols {
			c := ""
			if i < len(r) {
				c = r[i]
			}
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c))
			if i == 0 || t.left {
				b.WriteString(" " + c + pad + " |")
			} else {
				b.WriteString(" " + pad + c + " |")
			}
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// secs formats a duration: milliseconds below a second, else seconds.
func secs(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%d ms", d.Milliseconds())
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

// thousands formats n with comma separators.
func thousands(n int) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, ch := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(ch)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
