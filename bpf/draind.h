/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Shared definitions of draind's BPF programs: map keys and values (exported
 * to Go through bpf2go -type, never hand-copied) and the maps the programs
 * share. Addresses are 16 bytes; IPv4 is stored IPv4-mapped (::ffff:a.b.c.d) so
 * that one key shape serves connect4, connect6 on dual-stack sockets, the
 * datagram hooks and the skb observer alike. Ports are in host byte order.
 */
#ifndef DRAIND_H
#define DRAIND_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define DRAIND_MAX_FRONTENDS 16384
#define DRAIND_MAX_SERVICES 16384
#define DRAIND_MAX_BACKENDS 131072
#define DRAIND_MAX_DRAINS 65536
#define DRAIND_MAX_UDP_REVERSE 65536
#define DRAIND_MAX_LOCAL_ADDRS 16384
#define DRAIND_MAX_GONE_PEERS 65536
#define DRAIND_MAX_GONE_FLOWS 65536

/* An (address, port, protocol) triple: a Service frontend or a draining pod
 * endpoint. port == 0 in a drain key means "every port of this pod IP" (a
 * drain Lease for a registry-only workload names no port). */
struct ep_key {
	__u8 addr[16];
	__u16 port;
	__u8 proto;
	__u8 pad;
};

enum frontend_flags {
	/* Go decided this frontend must not be steered (sessionAffinity,
	 * traffic policy it cannot honour); kept in the map so the skip is
	 * counted instead of silent. */
	FRONTEND_NO_STEER = 1 << 0,
};

struct frontend_val {
	__u32 svc_id;
	__u32 flags;
	__u64 expires_ns; /* CLOCK_BOOTTIME; 0 or past = ignored */
};

/* The selectable backend set of one service-port. Backends live in two
 * generations; Go fills the inactive one, then flips gen here with a single
 * map update, so a connect() sees either the old or the new set, never a mix
 * that contains a backend which just started draining. */
struct svc_val {
	__u32 count;
	__u32 gen;
	__u64 expires_ns;
};

struct backend_key {
	__u32 svc_id;
	__u16 slot;
	__u8 gen;
	__u8 pad;
};

struct backend_val {
	__u8 addr[16];
	__u16 port;
	__u8 pad[2];
};

enum drain_policy {
	POLICY_REWRITE = 0,
	POLICY_REFUSE = 1,
	POLICY_OFF = 2,
};

struct drain_val {
	__u32 svc_id; /* 0: no service-port (registry-only), nothing to rewrite to */
	__u8 policy;
	__u8 pad[3];
	__u64 expires_ns;
};

/* Per draining endpoint activity, written by the programs only. Go reads it
 * and deletes it when the drain is forgotten. steered, refused and passed
 * count connect()s and unconnected UDP datagrams alike. */
struct drain_stats {
	__u64 syns;        /* SYNs that reached the pod (observe.c) */
	__u64 last_syn_ns; /* CLOCK_BOOTTIME of the last one */
	__u64 steered;     /* connect()s/datagrams to the pod IP rewritten elsewhere */
	__u64 refused;     /* connect()s/datagrams to the pod IP refused */
	__u64 passed;      /* connect()s/datagrams to the pod IP let through (off, no backend) */
};

/* Whether anything drains on this node's maps. Every hook reads it first, so
 * that when nothing drains a connect(), a datagram or a packet costs one
 * (inlined) array lookup instead of the frontend and drain lookups. */
struct node_state {
	__u32 draining; /* nonzero: draind_frontends or draind_drains may hold entries */
	/* nonzero: draind_gone_peers or draind_gone_flows may hold entries (the
	 * socket hooks' gate; a draind that predates it leaves it 0, and its
	 * maps hold no gone entries). */
	__u32 gone;
};

/* A reverse translation: the socket (its cookie) received a datagram rewritten
 * to this backend, so datagrams from the backend must look as if they came
 * from the address the application sent to. */
struct udp_rev_key {
	__u64 cookie;
	__u8 addr[16];
	__u16 port;
	__u8 pad[6];
};

/* Per-socket mark: this socket has reverse translations. */
struct udp_sock_state {
	__u32 flags; /* none yet: presence is the mark */
};

/* An address alone (v4-mapped for IPv4): a local pod address whose
 * connections are counted, or a peer that is gone. */
struct addr_key {
	__u8 addr[16];
};

/* The passively established TCP connections of one local address: opened
 * counts those the sock_ops program saw established, closed those of them
 * it saw leave ESTABLISHED/CLOSE_WAIT. Both only grow; live = opened -
 * closed. Written by the program only. */
struct conn_count {
	__u64 opened;
	__u64 closed;
};

/* A pod that is gone (its hosting node said so, and no other pod holds its
 * IP): sockets connected to it before gone_ns end at their next
 * retransmission timeout (TCP) or send (connected UDP). */
struct gone_val {
	__u64 gone_ns;    /* CLOCK_BOOTTIME the peer was known gone */
	__u64 expires_ns; /* CLOCK_BOOTTIME; past = ignored */
};

/* One client socket's connection, as the socket sees it (ports in host
 * byte order): a flow to a Service VIP that conntrack translated to a gone
 * pod. */
struct flow_key {
	__u8 local[16];
	__u8 remote[16];
	__u16 local_port;
	__u16 remote_port;
	__u32 pad;
};

enum sock_flags {
	SOCK_COUNTED = 1 << 0,   /* passive: counted in draind_local_conns */
	SOCK_UNCOUNTED = 1 << 1, /* passive: its close was counted */
	SOCK_ENDED = 1 << 2,     /* draind ended it (counted once) */
};

/* Per-socket state: when the socket was established (TCP) or connected
 * (UDP), and what draind did with it. */
struct sock_state {
	__u64 since_ns; /* CLOCK_BOOTTIME */
	__u32 flags;
	__u32 pad;
};

/* What the socket hooks did, for metrics and tests. */
enum sock_event {
	SOCK_EV_COUNTED = 0,      /* passive connection established and counted */
	SOCK_EV_UNCOUNTED,        /* a counted connection left ESTABLISHED/CLOSE_WAIT */
	SOCK_EV_NO_STORAGE,       /* per-socket storage could not be created: not counted */
	SOCK_EV_TCP_ENDED,        /* TCP socket to a gone pod IP: user timeout set */
	SOCK_EV_TCP_ENDED_FLOW,   /* TCP socket on a flow to a gone pod (via a VIP): ended */
	SOCK_EV_TCP_SPARED,       /* peer gone, but the socket is newer: left alone */
	SOCK_EV_TCP_SETSOCKOPT_FAILED, /* the kernel refused the user timeout */
	SOCK_EV_UDP_REFUSED,      /* datagram of a connected UDP socket to a gone pod refused */
	SOCK_EV_UDP_ENDED,        /* ... the first of them for that socket */
	SOCK_EV_UDP_SPARED,       /* peer gone, but the socket connected after: sent */
	SOCK_EV_MAX,
};

/* When counting started (CLOCK_BOOTTIME ns), written by Go when it first
 * attaches the sock_ops program to fresh maps: connections established
 * before it are not in draind_local_conns. */
struct sock_info {
	__u64 counting_since_ns;
};

volatile const enum sock_event draind_num_sock_events = SOCK_EV_MAX;

enum outcome {
	OUT_STEERED_CLUSTERIP = 0, /* frontend rewritten to a selectable backend */
	OUT_STEERED_PODIP,         /* draining pod IP rewritten (rewrite policy) */
	OUT_REFUSED,               /* draining pod IP refused (refuse policy) */
	OUT_PASS_OFF,              /* draining pod IP let through (off policy) */
	OUT_PASS_NO_STEER,         /* frontend marked do-not-steer */
	OUT_NO_BACKEND_CLUSTERIP,  /* frontend, but no selectable backend: fail open */
	OUT_NO_BACKEND_PODIP,      /* draining pod IP, rewrite, no backend: fail open */
	OUT_EXPIRED,               /* matching entry past its expiry: fail open */
	OUT_SYN_DRAINING,          /* SYN arrived at a draining endpoint (observe.c) */
	OUT_MAX,
};

/* Referenced so the enums reach BTF: the Go side (bpf2go -type) names outcomes
 * and policies from them instead of a hand-kept copy, and checks its counter
 * layout against draind_num_outcomes at load. */
volatile const enum outcome draind_num_outcomes = OUT_MAX;
volatile const enum drain_policy draind_max_policy = POLICY_OFF;

/* Whether the kernel has bpf_set_retval in sock_addr programs (Linux 5.18+).
 * Load sets it before loading: where it is 0 the verifier sees the call as
 * dead code and never checks the helper, and a refusal fails with EPERM. */
volatile const __u32 draind_have_set_retval = 1;

enum family_idx {
	FAMILY_V4 = 0,
	FAMILY_V6 = 1,
	FAMILY_MAX,
};

/* Frontends of service-ports that currently have a draining endpoint. Written
 * by Go only while a drain lasts; outside it kube-proxy does its normal job. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, DRAIND_MAX_FRONTENDS);
	__type(key, struct ep_key);
	__type(value, struct frontend_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} draind_frontends SEC(".maps");

/* Service-port id -> size and generation of its selectable backend set. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, DRAIND_MAX_SERVICES);
	__type(key, __u32);
	__type(value, struct svc_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} draind_services SEC(".maps");

/* (service-port id, generation, slot) -> a ready, non-draining backend. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, DRAIND_MAX_BACKENDS);
	__type(key, struct backend_key);
	__type(value, struct backend_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} draind_backends SEC(".maps");

/* Draining pod endpoints, cluster-wide. steer.c acts on connect()s to them;
 * observe.c counts SYNs reaching the local ones. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, DRAIND_MAX_DRAINS);
	__type(key, struct ep_key);
	__type(value, struct drain_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} draind_drains SEC(".maps");

/* Activity per draining endpoint (same key as the matched draind_drains
 * entry). Created by the programs on first use. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, DRAIND_MAX_DRAINS);
	__type(key, struct ep_key);
	__type(value, struct drain_stats);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} draind_drain_stats SEC(".maps");

/* Outcome counters of connect()s (and SYNs), index outcome * FAMILY_MAX +
 * family. Per CPU so the connect() path never contends on a cache line. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, OUT_MAX * FAMILY_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} draind_counters SEC(".maps");

/* The same outcomes for unconnected UDP datagrams (udp.c), kept apart so that
 * a resolver's query rate does not read as connections. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, OUT_MAX * FAMILY_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} draind_udp_counters SEC(".maps");

/* The "nothing drains" flag (struct node_state), one entry. Written by Go
 * only: set before the first frontend or drain entry is written, cleared only
 * after the last one is deleted, recomputed from the maps when draind adopts
 * them. A stale "draining" costs lookups; a stale "idle" would hide entries,
 * which is why the order matters. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct node_state);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} draind_node SEC(".maps");

/* Reverse translations of steered UDP: (socket cookie, backend) -> the address
 * the application sent to. Written by the programs only, when they rewrite a
 * UDP destination (sendmsg, and connect of a UDP socket); read by recvmsg to
 * give the reply the source the application expects. LRU, so it never fills:
 * the oldest translations go first, long after their replies came. Cookies
 * are never reused, so a stale entry cannot match another socket. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, DRAIND_MAX_UDP_REVERSE);
	__type(key, struct udp_rev_key);
	__type(value, struct backend_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} draind_udp_reverse SEC(".maps");

/* Sockets that have reverse translations (struct udp_sock_state), written by
 * the programs next to draind_udp_reverse. recvmsg looks here first: a socket
 * without the mark (every socket, unless it sent through steering) costs one
 * per-socket lookup and no cookie or hash. The storage lives and dies with its
 * socket, so a connected UDP socket steered during a drain keeps its
 * translation for as long as it lives. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct udp_sock_state);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} draind_udp_sockets SEC(".maps");

/* Passively established TCP connections per local pod address (struct
 * conn_count), written by sockops.c only: what "live connections" of a
 * draining pod counts on any CNI. Keys are this node's pod addresses, so the
 * map is bounded by the node's pod ranges; Go prunes idle keys no local pod
 * holds. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, DRAIND_MAX_LOCAL_ADDRS);
	__type(key, struct addr_key);
	__type(value, struct conn_count);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} draind_local_conns SEC(".maps");

/* Gone pod IPs (struct gone_val), written by Go only: pods whose hosting
 * node said they are gone and whose IP no other pod holds. Client sockets
 * connected to them end (sockops.c: TCP at its next retransmission timeout;
 * egress.c: connected UDP at its next send). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, DRAIND_MAX_GONE_PEERS);
	__type(key, struct addr_key);
	__type(value, struct gone_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} draind_gone_peers SEC(".maps");

/* Client flows to a Service VIP that this node's conntrack translated to a
 * gone pod (the socket itself only knows the VIP), written by Go from the
 * conntrack table. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, DRAIND_MAX_GONE_FLOWS);
	__type(key, struct flow_key);
	__type(value, struct gone_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} draind_gone_flows SEC(".maps");

/* Per-socket state (struct sock_state): passive TCP sockets from their
 * establishment (always: counting needs it); active TCP sockets and
 * connected UDP sockets only when their peer is listed gone as they connect
 * (a new pod that reused the IP). A client socket without it connected
 * before every gone entry that names its peer. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sock_state);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} draind_sock_state SEC(".maps");

/* Socket hook events (enum sock_event) by family, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SOCK_EV_MAX * FAMILY_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} draind_sock_counters SEC(".maps");

/* One struct sock_info, written by Go. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sock_info);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} draind_sock_info SEC(".maps");

/* node_state returns the flags every hook reads first (NULL only if the
 * map is broken: callers then take the full path of their own fast path,
 * towards steering and towards sparing sockets). */
static __always_inline struct node_state *node_flags(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&draind_node, &zero);
}

static __always_inline void count_sock(enum sock_event e, enum family_idx f)
{
	__u32 idx = (__u32)e * FAMILY_MAX + (__u32)f;
	__u64 *v = bpf_map_lookup_elem(&draind_sock_counters, &idx);

	if (v)
		*v += 1;
}

/* node_draining is the fast path of every hook: false when nothing drains on
 * this node. Fails towards "draining" (full lookups), never towards hiding an
 * entry. */
static __always_inline int node_draining(void)
{
	__u32 zero = 0;
	struct node_state *st = bpf_map_lookup_elem(&draind_node, &zero);

	return !st || st->draining;
}

static __always_inline void count_in(void *counters, enum outcome o, enum family_idx f)
{
	__u32 idx = (__u32)o * FAMILY_MAX + (__u32)f;
	__u64 *v = bpf_map_lookup_elem(counters, &idx);

	if (v)
		*v += 1;
}

static __always_inline void count(enum outcome o, enum family_idx f)
{
	count_in(&draind_counters, o, f);
}

/* stats_of returns the activity record of a draining endpoint, creating it. */
static __always_inline struct drain_stats *stats_of(const struct ep_key *key)
{
	struct drain_stats *st = bpf_map_lookup_elem(&draind_drain_stats, key);

	if (!st) {
		struct drain_stats zero = {};

		/* A full map only loses statistics, never steering. */
		bpf_map_update_elem(&draind_drain_stats, key, &zero, BPF_NOEXIST);
		st = bpf_map_lookup_elem(&draind_drain_stats, key);
	}
	return st;
}

/* find_drain looks the endpoint up, then its all-ports entry. On a hit, key
 * is left as the matched key. */
static __always_inline struct drain_val *find_drain(struct ep_key *key)
{
	struct drain_val *dr = bpf_map_lookup_elem(&draind_drains, key);

	if (dr)
		return dr;
	key->port = 0;
	return bpf_map_lookup_elem(&draind_drains, key);
}

#endif /* DRAIND_H */
