package bpf

import (
	"fmt"
	"net/netip"
	"time"
)

// Protocol is the layer-4 protocol of an endpoint (IANA numbers).
type Protocol uint8

// Protocols the datapath distinguishes.
const (
	TCP Protocol = 6
	UDP Protocol = 17
)

func (p Protocol) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	}
	return fmt.Sprintf("proto-%d", uint8(p))
}

// Policy says what a connect() straight to a draining pod IP gets.
type Policy uint8

// Pod-IP policies, in the order of increasing caution: when one endpoint has
// several, the most cautious (the highest) wins.
const (
	PolicyRewrite Policy = Policy(steerDrainPolicyPOLICY_REWRITE)
	PolicyRefuse  Policy = Policy(steerDrainPolicyPOLICY_REFUSE)
	PolicyOff     Policy = Policy(steerDrainPolicyPOLICY_OFF)
)

func (p Policy) String() string {
	switch p {
	case PolicyRewrite:
		return "rewrite"
	case PolicyRefuse:
		return "refuse"
	case PolicyOff:
		return "off"
	}
	return fmt.Sprintf("policy-%d", uint8(p))
}

// ParsePolicy parses the value of the draind.io/pod-ip-steering annotation.
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "rewrite":
		return PolicyRewrite, nil
	case "refuse":
		return PolicyRefuse, nil
	case "off":
		return PolicyOff, nil
	}
	return 0, fmt.Errorf("unknown pod-IP policy %q (want rewrite, refuse or off)", s)
}

// ServicePortID names one service-port of one IP family in the maps. Zero
// means "none".
type ServicePortID uint32

// EndpointKey is an (address, port, protocol) triple: a Service frontend or a
// draining endpoint. In a drain, Port 0 covers every port of the address.
type EndpointKey struct {
	Addr  netip.Addr
	Port  uint16
	Proto Protocol
}

func (k EndpointKey) String() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(k.Addr, k.Port), k.Proto)
}

// Compare orders keys by address, port, then protocol (for sorted output).
func (k EndpointKey) Compare(o EndpointKey) int {
	if c := k.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	if k.Port != o.Port {
		if k.Port < o.Port {
			return -1
		}
		return 1
	}
	return int(k.Proto) - int(o.Proto)
}

// Frontend is a Service ClusterIP:port whose service-port has a draining
// endpoint. connect()s to it go to a selectable backend of Service.
type Frontend struct {
	Key     EndpointKey
	Service ServicePortID
	// NoSteer keeps the entry (so skips are counted) but never rewrites.
	NoSteer bool
	Expires time.Time
}

// Drain is a draining endpoint: what a connect() straight to it gets.
type Drain struct {
	Key     EndpointKey
	Service ServicePortID
	Policy  Policy
	Expires time.Time
}

// Backends is the selectable backend set of a service-port.
type Backends struct {
	Service  ServicePortID
	Backends []netip.AddrPort
	Expires  time.Time
}

// DrainStats is what the programs saw for one draining endpoint.
type DrainStats struct {
	SYNs    uint64
	LastSYN time.Time // zero if none
	Steered uint64
	Refused uint64
	Passed  uint64
}

// Outcome is what the datapath did with a connect() (or a SYN).
type Outcome uint32

// Outcomes, numbered as in bpf/draind.h.
const (
	OutSteeredClusterIP   = Outcome(steerOutcomeOUT_STEERED_CLUSTERIP)
	OutSteeredPodIP       = Outcome(steerOutcomeOUT_STEERED_PODIP)
	OutRefused            = Outcome(steerOutcomeOUT_REFUSED)
	OutPassOff            = Outcome(steerOutcomeOUT_PASS_OFF)
	OutPassNoSteer        = Outcome(steerOutcomeOUT_PASS_NO_STEER)
	OutNoBackendClusterIP = Outcome(steerOutcomeOUT_NO_BACKEND_CLUSTERIP)
	OutNoBackendPodIP     = Outcome(steerOutcomeOUT_NO_BACKEND_PODIP)
	OutExpired            = Outcome(steerOutcomeOUT_EXPIRED)
	OutSYNDraining        = Outcome(steerOutcomeOUT_SYN_DRAINING)
	NumOutcomes           = int(steerOutcomeOUT_MAX)
)

var outcomeNames = [NumOutcomes]string{
	OutSteeredClusterIP:   "steered_clusterip",
	OutSteeredPodIP:       "steered_podip",
	OutRefused:            "refused",
	OutPassOff:            "pass_off",
	OutPassNoSteer:        "pass_no_steer",
	OutNoBackendClusterIP: "no_backend_clusterip",
	OutNoBackendPodIP:     "no_backend_podip",
	OutExpired:            "expired",
	OutSYNDraining:        "syn_draining",
}

func (o Outcome) String() string {
	if int(o) < NumOutcomes {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome-%d", uint32(o))
}

// Family is an IP family index of the counters.
type Family int

// Families.
const (
	IPv4 Family = 0
	IPv6 Family = 1
)

func (f Family) String() string {
	if f == IPv6 {
		return "ipv6"
	}
	return "ipv4"
}

// Counters are the datapath's outcome counters, summed over CPUs.
type Counters [NumOutcomes][2]uint64

// Get returns one counter.
func (c *Counters) Get(o Outcome, f Family) uint64 { return c[o][f] }

// Dump is everything in the maps, sorted, for `draind bpf dump`.
type Dump struct {
	Frontends []Frontend
	Backends  []Backends
	Drains    []Drain
	Stats     map[EndpointKey]DrainStats
	Counters  Counters
	// DatagramCounters count unconnected UDP datagrams by outcome.
	DatagramCounters Counters
}

// MarshalText renders the policy by name (JSON dumps).
func (p Policy) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText parses a policy name.
func (p *Policy) UnmarshalText(b []byte) error {
	v, err := ParsePolicy(string(b))
	*p = v
	return err
}

// MarshalText renders the protocol by name (JSON dumps).
func (p Protocol) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText parses TCP or UDP.
func (p *Protocol) UnmarshalText(b []byte) error {
	switch string(b) {
	case "TCP":
		*p = TCP
	case "UDP":
		*p = UDP
	default:
		return fmt.Errorf("unknown protocol %q", b)
	}
	return nil
}
