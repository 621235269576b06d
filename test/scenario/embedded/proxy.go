package embedded

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"

	"github.com/draind/draind/test/bed"
)

// proxy stands in for kube-proxy in iptables mode on one node: it turns
// Services and EndpointSlices into the same DNAT structure (a chain per
// service port spreading new connections at random, see bed.NAT) and writes
// the whole table in one netlink transaction, like kube-proxy's
// iptables-restore. Like kube-proxy with its default
// --iptables-min-sync-period it syncs at most once per MinSyncPeriod, and a
// sync starts SyncDelay after the change that triggers it (kube-proxy's
// processing and iptables-restore).
type proxy struct {
	node                 *bed.Node
	nat                  *bed.NAT
	services             corelisters.ServiceLister
	slices               discoverylisters.EndpointSliceLister
	syncDelay, minPeriod time.Duration
	log                  *slog.Logger
	kick                 chan struct{}

	lastSync time.Time // sync goroutine

	mu         sync.Mutex
	programmed map[netip.AddrPort][]netip.AddrPort
	changed    chan struct{} // closed and replaced after every sync
}

// natTable names the stand-in's table in each node namespace.
const natTable = "demo_kube_proxy"

func newProxy(node *bed.Node, services corelisters.ServiceLister, slices discoverylisters.EndpointSliceLister, syncDelay, minPeriod time.Duration, log *slog.Logger) (*proxy, error) {
	nat, err := bed.NewNAT(node.NS, natTable, false)
	if err != nil {
		return nil, fmt.Errorf("creating the service NAT table on %s: %w", node.Name, err)
	}
	return &proxy{node: node, nat: nat, services: services, slices: slices, syncDelay: syncDelay, minPeriod: minPeriod,
		log: log.With("node", node.Name), kick: make(chan struct{}, 1),
		programmed: map[netip.AddrPort][]netip.AddrPort{}, changed: make(chan struct{})}, nil
}

func (p *proxy) changedEvent() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (p *proxy) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
		at := time.Now().Add(p.syncDelay)
		if next := p.lastSync.Add(p.minPeriod); next.After(at) {
			at = next
		}
		if !sleepCtx(ctx, time.Until(at)) {
			return
		}
		select { // changes from here on trigger the next sync
		case <-p.kick:
		default:
		}
		p.lastSync = time.Now()
		if err := p.sync(ctx); err != nil {
			p.log.Error("kube-proxy stand-in sync failed", "err", err)
			p.changedEvent() // retry
		}
	}
}

func (p *proxy) sync(ctx context.Context) error {
	svcs, err := p.services.List(labels.Everything())
	if err != nil {
		return err
	}
	sls, err := p.slices.List(labels.Everything())
	if err != nil {
		return err
	}
	rules := proxyRules(svcs, sls)
	if err := p.nat.Sync(natServices(rules)); err != nil {
		return fmt.Errorf("kube-proxy stand-in sync on %s: %w", p.node.Name, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.programmed = map[netip.AddrPort][]netip.AddrPort{}
	for _, r := range rules {
		p.programmed[r.vip] = r.endpoints
	}
	close(p.changed)
	p.changed = make(chan struct{})
	return nil
}

// waitProgrammed waits until the rules balance vip over exactly eps.
func (p *proxy) waitProgrammed(ctx context.Context, vip netip.AddrPort, eps []netip.AddrPort) error {
	want := slices.Clone(eps)
	slices.SortFunc(want, netip.AddrPort.Compare)
	for {
		p.mu.Lock()
		got := p.programmed[vip]
		ch := p.changed
		p.mu.Unlock()
		if slices.Equal(got, want) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("waiting for the rules of %s on %s to balance over %v (now %v): %w", vip, p.node.Name, want, got, ctx.Err())
		}
	}
}

// serviceRule is one ClusterIP service port and where its new connections
// go; chain names it stably (sorting).
type serviceRule struct {
	chain     string
	vip       netip.AddrPort
	endpoints []netip.AddrPort // sorted
}

// proxyRules computes what kube-proxy programs for TCP IPv4 ClusterIPs:
// every ready endpoint of the port; when none is ready, the serving
// terminating ones (KEP-1669).
func proxyRules(svcs []*corev1.Service, sls []*discoveryv1.EndpointSlice) []serviceRule {
	var out []serviceRule
	for _, svc := range svcs {
		vip, err := netip.ParseAddr(svc.Spec.ClusterIP)
		if err != nil || !vip.Is4() {
			continue
		}
		for _, sp := range svc.Spec.Ports {
			if sp.Protocol != corev1.ProtocolTCP {
				continue
			}
			var ready, terminating []netip.AddrPort
			for _, sl := range sls {
				if sl.Namespace != svc.Namespace || sl.Labels[discoveryv1.LabelServiceName] != svc.Name || sl.AddressType != discoveryv1.AddressTypeIPv4 {
					continue
				}
				port := int32(-1)
				for _, p := range sl.Ports {
					if p.Port != nil && (p.Name == nil && sp.Name == "" || p.Name != nil && *p.Name == sp.Name) {
						port = *p.Port
					}
				}
				if port < 0 {
					continue
				}
				for _, ep := range sl.Endpoints {
					isReady := ep.Conditions.Ready == nil || *ep.Conditions.Ready
					serving := isReady
					if ep.Conditions.Serving != nil {
						serving = *ep.Conditions.Serving
					}
					isTerminating := ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
					for _, a := range ep.Addresses {
						ip, err := netip.ParseAddr(a)
						if err != nil {
							continue
						}
						ap := netip.AddrPortFrom(ip, uint16(port))
						switch {
						case isReady:
							ready = append(ready, ap)
						case serving && isTerminating:
							terminating = append(terminating, ap)
						}
					}
				}
			}
			eps := ready
			if len(eps) == 0 {
				eps = terminating
			}
			slices.SortFunc(eps, netip.AddrPort.Compare)
			eps = slices.Compact(eps)
			sum := sha256.Sum256([]byte(fmt.Sprintf("%s/%s:%s/%s", svc.Namespace, svc.Name, sp.Name, sp.Protocol)))
			out = append(out, serviceRule{
				chain:     "DEMO-SVC-" + strings.ToUpper(hex.EncodeToString(sum[:])[:12]),
				vip:       netip.AddrPortFrom(vip, uint16(sp.Port)),
				endpoints: eps,
			})
		}
	}
	slices.SortFunc(out, func(a, b serviceRule) int { return strings.Compare(a.chain, b.chain) })
	return out
}

// natServices is what the NAT table must hold for rules: every service port
// with its endpoints, in the rules' (sorted) order.
func natServices(rules []serviceRule) []bed.NATService {
	out := make([]bed.NATService, 0, len(rules))
	for _, r := range rules {
		out = append(out, bed.NATService{VIP: r.vip, Proto: "tcp", Endpoints: r.endpoints})
	}
	return out
}
