package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/draind/draind/bpf"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/draind/draind/daemon"
)

// errUnhealthy makes `draind status` exit non-zero after printing.
var errUnhealthy = errors.New("draind is unhealthy")

func newStatusCmd() *cobra.Command {
	var socket, output string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the daemon's state on this node (exit status 1 when unhealthy)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := daemon.FetchStatus(cmd.Context(), socket)
			if err != nil {
				return err
			}
			if err := printStatus(cmd.OutOrStdout(), st, output); err != nil {
				return err
			}
			if !st.Healthy {
				return errUnhealthy
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&socket, "socket", DefaultStatusSocket, "the daemon's status socket")
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: json or wide (default: text)")
	return cmd
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func conntrackLine(c daemon.ConntrackStatus, sockets bool) string {
	if !c.Enabled {
		reason := c.Reason
		if reason == "" {
			reason = "disabled"
		}
		if sockets {
			return "OFF (" + reason + "): live connections from the pods' sockets only; stale flows are not expired"
		}
		return "OFF (" + reason + "): drained means only no new SYN; stale flows are not expired"
	}
	if !c.Timestamps {
		return "on, timestamps OFF (net.netfilter.nf_conntrack_timestamp=0: flows of a reused pod IP are left alone)"
	}
	return "on, timestamps on"
}

// configLines lays the settings out as name=value, comma-separated, in
// lines of at most width characters.
func configLines(cfg []daemon.ConfigEntry, width int) []string {
	var lines []string
	var cur strings.Builder
	for i, e := range cfg {
		item := e.Name + "=" + e.Value
		if i < len(cfg)-1 {
			item += ","
		}
		if cur.Len() > 0 && cur.Len()+1+len(item) > width {
			lines = append(lines, cur.String())
			cur.Reset()
		}
		if cur.Len() > 0 {
			cur.WriteByte(' ')
		}
		cur.WriteString(item)
	}
	if cur.Len() > 0 {
		lines = append(lines, cur.String())
	}
	return lines
}

func printStatus(w io.Writer, st *daemon.Status, output string) error {
	switch output {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	case "", "wide":
	default:
		return fmt.Errorf("unknown output format %q (want json or wide)", output)
	}
	wide := output == "wide"
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	printHeader(tw, st, wide)
	tw.Flush()

	fmt.Fprintf(w, "\nDraining endpoints: %d\n", len(st.Pods))
	if len(st.Pods) > 0 {
		if err := printPods(w, st, wide); err != nil {
			return err
		}
	}
	if !wide {
		return nil
	}
	fmt.Fprintf(w, "\nService-ports: %d\n", len(st.ServicePorts))
	if len(st.ServicePorts) == 0 {
		return nil
	}
	return printServicePorts(w, st)
}

// printServicePorts writes the table of service-ports steered for, by the
// id `draind bpf dump` prints.
func printServicePorts(w io.Writer, st *daemon.Status) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSERVICE\tPORT\tPROTOCOL\tFAMILY\tFRONTENDS\tSELECTABLE\tDRAINING\tLINGERING")
	for _, sp := range st.ServicePorts {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\n", sp.ID, sp.Service, orDash(sp.Port), sp.Protocol, sp.Family,
			orDash(strings.Join(sp.Frontends, ",")), sp.Selectable, len(sp.Draining), len(sp.Lingering))
	}
	return tw.Flush()
}

// printHeader writes the node's lines of the status: health, kernel,
// programs, conntrack, sockets, then printState's.
func printHeader(tw io.Writer, st *daemon.Status, wide bool) {
	health := "yes"
	switch {
	case !st.Healthy:
		health = "NO: " + strings.Join(st.Problems, "; ")
	case len(st.Warnings) > 0:
		health = "DEGRADED: " + strings.Join(st.Warnings, "; ")
	}
	fmt.Fprintf(tw, "Node:\t%s\n", st.Node)
	fmt.Fprintf(tw, "Version:\t%s\n", st.Version)
	fmt.Fprintf(tw, "Healthy:\t%s\n", health)
	if !st.Healthy && len(st.Warnings) > 0 {
		fmt.Fprintf(tw, "Warnings:\t%s\n", strings.Join(st.Warnings, "; "))
	}
	uptime := "-"
	if !st.Started.IsZero() {
		uptime = fmt.Sprintf("%s (started %s)", bpf.ShortDuration(st.Time.Sub(st.Started)), st.Started.UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(tw, "Uptime:\t%s\n", uptime)
	lastSync := "never"
	if !st.LastSync.IsZero() {
		lastSync = bpf.Age(st.Time, st.LastSync) + " ago"
	}
	fmt.Fprintf(tw, "Last sync:\t%s\n", lastSync)
	f := st.Features
	fmt.Fprintf(tw, "Kernel:\t%s (cgroup2 %s, BTF %s, set_retval %s)\n", f.Kernel, f.Cgroup2, yesNo(f.BTF), yesNo(f.HelperSetRetval))
	fmt.Fprintf(tw, "Kernel features:\t%s\n", kernelFeaturesLine(f.KernelFeatures))
	fmt.Fprintf(tw, "Cgroup:\t%s\n", orDash(st.Cgroup))
	fmt.Fprintf(tw, "Pin directory:\t%s\n", orDash(st.PinDir))
	attached := "none"
	if len(st.Attached) > 0 {
		attached = strings.Join(st.Attached, ", ")
	}
	fmt.Fprintf(tw, "Programs:\t%s\n", attached)
	fmt.Fprintf(tw, "Conntrack:\t%s\n", conntrackLine(st.Conntrack, st.Sockets.Loaded))
	fmt.Fprintf(tw, "Sockets:\t%s\n", socketsLine(st.Sockets, st.Time))
	printState(tw, st, wide)
}

// printState writes the informers, maps, counters and configuration lines.
func printState(tw io.Writer, st *daemon.Status, wide bool) {
	names := make([]string, 0, len(st.Informers))
	for n := range st.Informers {
		names = append(names, n)
	}
	sort.Strings(names)
	var inf []string
	for _, n := range names {
		s := "synced"
		if !st.Informers[n] {
			s = "SYNCING"
		}
		inf = append(inf, n+" "+s)
	}
	fmt.Fprintf(tw, "Informers:\t%s\n", strings.Join(inf, ", "))
	var maps []string
	for _, m := range st.Maps {
		s := fmt.Sprintf("%s %d/%d", strings.TrimPrefix(string(m.Name), "draind_"), m.Entries, m.Capacity)
		if m.UpdateErrors > 0 {
			s += fmt.Sprintf(" (%d errors)", m.UpdateErrors)
		}
		maps = append(maps, s)
	}
	fmt.Fprintf(tw, "Maps:\t%s\n", strings.Join(maps, ", "))
	var ctr []string
	for _, c := range st.Counters {
		if c.IPv4+c.IPv6 > 0 || wide {
			ctr = append(ctr, fmt.Sprintf("%s %d/%d", c.Outcome, c.IPv4, c.IPv6))
		}
	}
	if len(ctr) == 0 {
		ctr = []string{"none yet"}
	}
	fmt.Fprintf(tw, "Counters (v4/v6):\t%s\n", strings.Join(ctr, ", "))
	for i, line := range configLines(st.Config, 90) {
		label := ""
		if i == 0 {
			label = "Config:"
		}
		fmt.Fprintf(tw, "%s\t%s\n", label, line)
	}
}

// printPods writes the table of draining endpoints' pods.
func printPods(w io.Writer, st *daemon.Status, wide bool) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	hdr := "POD\tIPS\tREASON\tSINCE\tDEADLINE\tSYNS(10s)\tLIVE\tSTEERED\tSTATE"
	if wide {
		hdr += "\tSYNS\tUID\tENTRIES"
	}
	fmt.Fprintln(tw, hdr)
	for _, p := range st.Pods {
		syns, live := "-", "-"
		if p.Local {
			syns, live = fmt.Sprint(p.SYNsLast10s), liveCell(p)
		}
		line := fmt.Sprintf("%s/%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s", p.Namespace, p.Name, strings.Join(p.IPs, ","), p.Reason,
			bpf.Age(st.Time, p.Since), bpf.Age(st.Time, p.Deadline), syns, live, p.Steered, p.State)
		if wide {
			line += fmt.Sprintf("\t%d\t%s\t%s", p.SYNs, p.UID, strings.Join(p.Entries, ","))
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}

// socketsLine says what the socket hooks do on this node.
func socketsLine(s daemon.SocketStatus, now time.Time) string {
	live := "live connections from " + strings.Join(s.LiveFrom, "+")
	if !s.Loaded {
		return fmt.Sprintf("OFF (%s): %s; client sockets to gone pods are not ended", s.Reason, live)
	}
	if !s.CountingSince.IsZero() {
		live += fmt.Sprintf(" (sockets counted since %s ago)", bpf.Age(now, s.CountingSince))
	}
	var ends []string
	if s.EndTCP {
		ends = append(ends, "TCP at the next retransmission timeout")
	}
	if s.EndUDP {
		ends = append(ends, "connected UDP at the next send")
	}
	end := "client sockets to gone pods are not ended"
	if len(ends) > 0 {
		end = "ends client sockets to gone pods: " + strings.Join(ends, ", ")
	}
	return fmt.Sprintf("%s; %s; %d gone peers, %d gone flows", live, end, s.GonePeers, s.GoneFlows)
}

// liveCell is a pod's live connections with the source that counted them
// ("partial": the pod predates socket counting on this node).
func liveCell(p daemon.PodStatus) string {
	switch {
	case p.LiveSource == "" || p.LiveSource == daemon.LiveFromNone:
		return fmt.Sprint(p.LiveConnections)
	case p.LiveSource == daemon.LiveFromSockets && p.LiveSocketsPartial:
		return fmt.Sprintf("%d (sockets, partial)", p.LiveConnections)
	}
	return fmt.Sprintf("%d (%s)", p.LiveConnections, p.LiveSource)
}

// kernelFeaturesLine says, per feature that depends on the kernel, on or off
// and why.
func kernelFeaturesLine(fs []bpf.KernelFeature) string {
	if len(fs) == 0 {
		return "-"
	}
	var out []string
	for _, f := range fs {
		if f.On {
			out = append(out, f.Name+" on")
		} else {
			out = append(out, fmt.Sprintf("%s OFF (%s)", f.Name, f.Reason))
		}
	}
	return strings.Join(out, ", ")
}
