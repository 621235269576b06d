// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/*
 * sockops.c: a sock_ops program on the pods' cgroup. It sees every TCP
 * socket of every pod on the node, whatever network namespace (and CNI) the
 * pod has, and does two things:
 *
 *  - counts live connections: each passively established connection is
 *    counted under its local (pod) address in draind_local_conns, and its
 *    close (leaving ESTABLISHED/CLOSE_WAIT) is counted too, once, only for a
 *    socket that was counted (draind_sock_state says so) since counting
 *    last started (draind_sock_info: a draind without the socket hooks
 *    resets the counts and that instant). "Drained" reads these counts: no
 *    conntrack table is needed;
 *  - ends client sockets to gone pods: every established socket asks for
 *    the retransmission-timeout callback; when it fires for a socket whose
 *    peer is a gone pod IP (draind_gone_peers), or whose flow conntrack
 *    translated to one (draind_gone_flows), and the socket predates the
 *    departure, TCP_USER_TIMEOUT is set to 1 ms. The kernel clamps the next
 *    retransmission timer to what is left of the user timeout, so the socket
 *    fails with ETIMEDOUT one tick later, instead of retransmitting into a
 *    dead address for minutes. A socket whose peer answers never reaches the
 *    callback; a socket established after the departure (a new pod that
 *    reused the IP) is left alone.
 *
 * Cost: per accepted connection one map update and one per-socket storage
 * (counting must run before any drain: the connections a drain waits for
 * were established before it); per outgoing connection one flag read and
 * one helper call (the retransmission callback has to be asked for at
 * establishment), and while gone entries exist two lookups.
 */

#include <linux/in.h>
#include <linux/in6.h>

#include "draind.h"

char __license[] SEC("license") = "Dual BSD/GPL";

#define AF_INET 2
#define AF_INET6 10
#define SOL_TCP 6
#define TCP_USER_TIMEOUT 18

/* The user timeout draind sets: the smallest there is. */
#define END_USER_TIMEOUT_MS 1

static __always_inline enum family_idx family_of(const struct bpf_sock_ops *skops, const __u8 *addr)
{
	if (skops->family == AF_INET)
		return FAMILY_V4;
	/* A dual-stack socket on an IPv4 connection (v4-mapped) counts as IPv4. */
	if (addr[10] == 0xff && addr[11] == 0xff && !(addr[0] | addr[1] | addr[2] | addr[3] | addr[4] | addr[5] |
						      addr[6] | addr[7] | addr[8] | addr[9]))
		return FAMILY_V4;
	return FAMILY_V6;
}

/* ctx_u32 reads one 32-bit context field: the verifier refuses wider
 * loads of the address arrays, which the compiler would otherwise merge. */
static __always_inline __u32 ctx_u32(const __u32 *p)
{
	return *(const volatile __u32 *)p;
}

static __always_inline void mapped4(__u8 *a, __u32 ip4)
{
	a[10] = 0xff;
	a[11] = 0xff;
	__builtin_memcpy(&a[12], &ip4, 4);
}

/* local_addr and remote_addr write the socket's addresses in key form. */
static __always_inline void local_addr(const struct bpf_sock_ops *skops, __u8 *a)
{
	__u32 w[4];

	if (skops->family == AF_INET) {
		mapped4(a, skops->local_ip4);
		return;
	}
	w[0] = ctx_u32(&skops->local_ip6[0]);
	w[1] = ctx_u32(&skops->local_ip6[1]);
	w[2] = ctx_u32(&skops->local_ip6[2]);
	w[3] = ctx_u32(&skops->local_ip6[3]);
	__builtin_memcpy(a, w, 16);
}

static __always_inline void remote_addr(const struct bpf_sock_ops *skops, __u8 *a)
{
	__u32 w[4];

	if (skops->family == AF_INET) {
		mapped4(a, skops->remote_ip4);
		return;
	}
	w[0] = ctx_u32(&skops->remote_ip6[0]);
	w[1] = ctx_u32(&skops->remote_ip6[1]);
	w[2] = ctx_u32(&skops->remote_ip6[2]);
	w[3] = ctx_u32(&skops->remote_ip6[3]);
	__builtin_memcpy(a, w, 16);
}

/* loopback connections (a sidecar talking to its app) are never a pod's
 * clients. */
static __always_inline int is_loopback(const __u8 *a)
{
	__u32 w[4];

	__builtin_memcpy(w, a, 16);
	if (a[10] == 0xff && a[11] == 0xff && !w[0] && !w[1])
		return a[12] == 127;
	return !w[0] && !w[1] && !w[2] && w[3] == bpf_htonl(1);
}

/* counted_state is where a passive connection is counted as live. */
static __always_inline int live_state(__u32 s)
{
	return s == BPF_TCP_ESTABLISHED || s == BPF_TCP_CLOSE_WAIT || s == BPF_TCP_SYN_RECV;
}

static __always_inline void on_passive(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	struct addr_key key = {};
	struct conn_count *cc;
	struct sock_state *ss;
	enum family_idx fam;

	local_addr(skops, key.addr);
	fam = family_of(skops, key.addr);
	/* Ask for the retransmission callback: a server socket to a client
	 * pod that vanished ends too. */
	if (is_loopback(key.addr)) {
		bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_RTO_CB_FLAG);
		return;
	}
	if (!sk)
		return;
	/* The storage first: a close is only counted for a socket that says it
	 * was counted. */
	ss = bpf_sk_storage_get(&draind_sock_state, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!ss) {
		count_sock(SOCK_EV_NO_STORAGE, fam);
		bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_RTO_CB_FLAG);
		return;
	}
	ss->since_ns = bpf_ktime_get_boot_ns();
	cc = bpf_map_lookup_elem(&draind_local_conns, &key);
	if (!cc) {
		struct conn_count zero = {};

		bpf_map_update_elem(&draind_local_conns, &key, &zero, BPF_NOEXIST);
		cc = bpf_map_lookup_elem(&draind_local_conns, &key);
		if (!cc) { /* full: not counted, and its close will not be either */
			count_sock(SOCK_EV_NO_STORAGE, fam);
			bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_RTO_CB_FLAG);
			return;
		}
	}
	__sync_fetch_and_add(&cc->opened, 1);
	ss->flags = SOCK_COUNTED;
	count_sock(SOCK_EV_COUNTED, fam);
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_RTO_CB_FLAG |
						 BPF_SOCK_OPS_STATE_CB_FLAG);
}

static __always_inline void on_state(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	struct addr_key key = {};
	struct sock_info *si;
	struct conn_count *cc;
	struct sock_state *ss;
	__u32 zero = 0;

	/* args[0]: old state, args[1]: new state. */
	if (live_state(skops->args[1]) || !sk)
		return;
	ss = bpf_sk_storage_get(&draind_sock_state, sk, 0, 0);
	/* No more state changes needed: the connection is over for us. */
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags & ~BPF_SOCK_OPS_STATE_CB_FLAG);
	if (!ss || !(ss->flags & SOCK_COUNTED) || (ss->flags & SOCK_UNCOUNTED))
		return;
	ss->flags |= SOCK_UNCOUNTED;
	/* Counted before counting last (re)started: the hooks were off for a
	 * while and the counts were reset then (Go), so this socket is not in
	 * them. */
	si = bpf_map_lookup_elem(&draind_sock_info, &zero);
	if (si && ss->since_ns < si->counting_since_ns)
		return;
	local_addr(skops, key.addr);
	cc = bpf_map_lookup_elem(&draind_local_conns, &key);
	if (cc)
		__sync_fetch_and_add(&cc->closed, 1);
	count_sock(SOCK_EV_UNCOUNTED, family_of(skops, key.addr));
}

/* gone_entry returns the gone entry that names this socket's peer: its
 * address, or else its exact flow (a VIP that conntrack translated). */
static __always_inline struct gone_val *gone_entry(struct bpf_sock_ops *skops, const struct addr_key *peer,
						   int *by_flow)
{
	struct flow_key fk = {};
	struct gone_val *g;

	g = bpf_map_lookup_elem(&draind_gone_peers, peer);
	if (g) {
		*by_flow = 0;
		return g;
	}
	local_addr(skops, fk.local);
	__builtin_memcpy(fk.remote, peer->addr, 16);
	fk.local_port = (__u16)skops->local_port;
	fk.remote_port = (__u16)bpf_ntohl(skops->remote_port);
	*by_flow = 1;
	return bpf_map_lookup_elem(&draind_gone_flows, &fk);
}

static __always_inline void on_active(struct bpf_sock_ops *skops)
{
	struct node_state *ns = node_flags();
	struct bpf_sock *sk = skops->sk;
	struct addr_key peer = {};
	struct sock_state *ss;
	__u32 flags = skops->bpf_sock_ops_cb_flags;
	int by_flow;

	bpf_sock_ops_cb_flags_set(skops, flags | BPF_SOCK_OPS_RTO_CB_FLAG);
	if ((ns && !ns->gone) || !sk)
		return;
	/* A socket is timestamped only if its peer (or flow) is listed gone
	 * as it is established: a new pod that reused the IP. Any other socket
	 * was established before every entry that may name its peer later, and
	 * needs no timestamp (one that does would cost an allocation per
	 * connection). */
	remote_addr(skops, peer.addr);
	if (!gone_entry(skops, &peer, &by_flow))
		return;
	ss = bpf_sk_storage_get(&draind_sock_state, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!ss) {
		/* It cannot say it is newer than the departure: it never asks
		 * for the callback that could end it (fail open). */
		bpf_sock_ops_cb_flags_set(skops, flags & ~BPF_SOCK_OPS_RTO_CB_FLAG);
		count_sock(SOCK_EV_NO_STORAGE, family_of(skops, peer.addr));
		return;
	}
	ss->since_ns = bpf_ktime_get_boot_ns();
	ss->flags = 0;
}

static __always_inline void on_rto(struct bpf_sock_ops *skops)
{
	struct node_state *ns = node_flags();
	struct bpf_sock *sk = skops->sk;
	struct addr_key peer = {};
	struct sock_state *ss;
	struct gone_val *g;
	enum family_idx fam;
	int by_flow = 0;
	int ms = END_USER_TIMEOUT_MS;

	/* Ending a socket needs a positive answer: a broken flag map spares. */
	if (!ns || !ns->gone || !sk)
		return;
	remote_addr(skops, peer.addr);
	g = gone_entry(skops, &peer, &by_flow);
	if (!g || g->expires_ns < bpf_ktime_get_boot_ns())
		return;
	fam = family_of(skops, peer.addr);
	ss = bpf_sk_storage_get(&draind_sock_state, sk, 0, 0);
	if (ss && ss->since_ns >= g->gone_ns) {
		count_sock(SOCK_EV_TCP_SPARED, fam);
		return;
	}
	if (ss && (ss->flags & SOCK_ENDED))
		return; /* the timer fires again before the socket fails */
	if (bpf_setsockopt(skops, SOL_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms))) {
		count_sock(SOCK_EV_TCP_SETSOCKOPT_FAILED, fam);
		return;
	}
	count_sock(by_flow ? SOCK_EV_TCP_ENDED_FLOW : SOCK_EV_TCP_ENDED, fam);
	if (!ss)
		ss = bpf_sk_storage_get(&draind_sock_state, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (ss)
		ss->flags |= SOCK_ENDED;
}

SEC("sockops")
int draind_sockops(struct bpf_sock_ops *skops)
{
	switch (skops->op) {
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		on_passive(skops);
		break;
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		on_active(skops);
		break;
	case BPF_SOCK_OPS_STATE_CB:
		on_state(skops);
		break;
	case BPF_SOCK_OPS_RTO_CB:
		on_rto(skops);
		break;
	}
	return 1;
}
