package hosted

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/daemon/nodeapi"
)

// measure reads SYNs and live connections of draining pods and settles
// waiters.
func (l *Drains) measure(ctx context.Context, now time.Time) {
	type job struct {
		ld   *drain
		keys []bpf.EndpointKey
		ips  []netip.Addr
	}
	var jobs []job
	l.mu.Lock()
	for uid, ld := range l.pods {
		if ld.state == StateGone || ld.state == StateCancelled {
			continue
		}
		keys := slices.Clone(l.keysFor[uid])
		for _, ip := range ld.ips {
			for _, proto := range []bpf.Protocol{bpf.TCP, bpf.UDP} {
				k := bpf.EndpointKey{Addr: ip, Proto: proto}
				if !slices.Contains(keys, k) {
					keys = append(keys, k)
				}
			}
		}
		jobs = append(jobs, job{ld, keys, slices.Clone(ld.ips)})
	}
	l.mu.Unlock()
	for _, j := range jobs {
		var syns, steered uint64
		var last time.Time
		statsRead := true
		for _, k := range j.keys {
			st, err := l.cfg.Datapath.DrainStats(k)
			if err != nil {
				// A SYN not counted could declare "drained" early: an
				// unreadable count blocks it, as an unknown live count does.
				statsRead = false
				l.cfg.Log.Warn("reading a draining endpoint's SYN count", logKeyErr, err)
				continue
			}
			syns += st.SYNs
			steered += st.Steered + st.Refused
			if st.LastSYN.After(last) {
				last = st.LastSYN
			}
		}
		lc := l.liveOf(ctx, j.ld, j.ips)
		live, checked := lc.Live, lc.Checked && statsRead
		l.mu.Lock()
		ld := j.ld
		ld.liveBy = lc
		if syns < ld.syns {
			syns = ld.syns // the stats entry was recreated: counts only grow
		}
		switch {
		case last.After(ld.lastSYN):
			// The observer's own timestamp of the last SYN: right even
			// for SYNs counted before this draind started.
			ld.lastSYN = last
		case syns > ld.syns && last.IsZero():
			ld.lastSYN = now // no timestamp: the growth is all we know
		}
		ld.syns, ld.steered, ld.live, ld.liveChecked = syns, steered, live, checked
		ld.synSamples = append(ld.synSamples, synSample{now, syns})
		for len(ld.synSamples) > 0 && now.Sub(ld.synSamples[0].at) > 11*time.Second {
			ld.synSamples = ld.synSamples[1:]
		}
		l.settle(ld, now)
		l.mu.Unlock()
	}
}

// isDrained applies the definition: no new SYN for quiet and no live
// connection left (l.mu held).
func (l *Drains) isDrained(ld *drain, now time.Time, quiet time.Duration) bool {
	from := ld.started
	if ld.lastSYN.After(from) {
		from = ld.lastSYN
	}
	return ld.liveChecked && ld.live == 0 && now.Sub(from) >= quiet
}

// settle updates the drain's state and answers waiters (l.mu held).
func (l *Drains) settle(ld *drain, now time.Time) {
	if ld.state == StateDraining || ld.state == StateTimedOut {
		if l.isDrained(ld, now, l.cfg.Quiet) {
			ld.state = StateDrained
			dur := now.Sub(ld.started)
			l.cfg.Metrics.DrainOutcomes.WithLabelValues("drained").Inc()
			l.cfg.Metrics.DrainDuration.Observe(dur.Seconds())
			l.event(ld, corev1.EventTypeNormal, EventDrained, fmt.Sprintf("drained after %.1fs: %d SYNs seen, %d connections left, %d steered away on this node",
				dur.Seconds(), ld.syns, ld.live, ld.steered))
			l.cfg.Log.Info("pod drained", logKeyPod, ld.namespace+"/"+ld.name, "seconds", dur.Seconds(), "syns", ld.syns)
		}
	}
	kept := ld.waiters[:0]
	for _, w := range ld.waiters {
		switch {
		case l.isDrained(ld, now, w.quiet):
			w.done <- l.resultOf(ld, now, w, StateDrained, 200)
			l.release(ld.uid)
		case !now.Before(w.deadline):
			if !ld.timedOut {
				ld.timedOut = true
				if ld.state != StateDrained {
					ld.state = StateTimedOut
				}
				l.cfg.Metrics.DrainOutcomes.WithLabelValues("timed_out").Inc()
				l.cfg.Metrics.DrainDuration.Observe(now.Sub(ld.started).Seconds())
				l.event(ld, corev1.EventTypeWarning, EventDrainTimedOut, fmt.Sprintf("not drained after %.1fs: %d live connections, last SYN %s ago",
					now.Sub(ld.started).Seconds(), ld.live, ago(now, ld.lastSYN)))
			}
			w.done <- l.resultOf(ld, now, w, StateTimedOut, 504)
			l.release(ld.uid)
		default:
			kept = append(kept, w)
		}
	}
	ld.waiters = kept
}

func ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return now.Sub(t).Round(100 * time.Millisecond).String()
}

func (l *Drains) resultOf(ld *drain, now time.Time, w *waiter, state string, code int) nodeapi.Result {
	r := nodeapi.Result{Pod: ld.namespace + "/" + ld.name, State: state, Drained: state == StateDrained,
		SYNs: ld.syns, LiveConnections: ld.live, Steered: ld.steered, Code: code}
	ld.liveBy.fillOffline(&r)
	if w != nil {
		r.WaitedSeconds = now.Sub(w.started).Seconds()
	}
	return r
}

func (l *Drains) finishWaiters(ld *drain, now time.Time, state string, code int) {
	for _, w := range ld.waiters {
		w.done <- l.resultOf(ld, now, w, state, code)
		l.release(ld.uid)
	}
	ld.waiters = nil
}

func (l *Drains) cancelAll(why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ld := range l.pods {
		for _, w := range ld.waiters {
			r := l.resultOf(ld, l.cfg.Clock.Now(), w, ld.state, 503)
			r.Error = why
			w.done <- r
			l.release(ld.uid)
		}
		ld.waiters = nil
	}
}
