/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The steering decision shared by the sock_addr hooks: connect4/6 (steer.c)
 * decide once per connect(), sendmsg4/6 (udp.c) once per unconnected UDP
 * datagram, with the same entries and the same rules:
 *
 *  - a Service frontend whose service-port drains goes to a selectable
 *    (ready, non-draining) backend of that service-port;
 *  - a draining pod IP is rewritten to a selectable backend of the same
 *    service-port, refused with ECONNREFUSED, or left alone, as the entry's
 *    policy says;
 *  - anything else, an expired entry, or no selectable backend is left
 *    untouched: the datapath fails open.
 */
#ifndef DRAIND_STEER_H
#define DRAIND_STEER_H

#include <linux/in.h>
#include <linux/errno.h>

#include "draind.h"

enum verdict {
	VERDICT_PASS,
	VERDICT_REWRITE,
	VERDICT_REFUSE,
};

/* What is being steered: it picks the counters and how a backend is chosen. */
enum steer_kind {
	/* A connect(): a random backend, counted in draind_counters. */
	STEER_CONNECT,
	/* An unconnected datagram: the backend follows from (socket, original
	 * destination), so one socket's datagrams to one address stay on one
	 * backend while the selectable set stays the same (kube-proxy's UDP
	 * conntrack entry keeps such a flow on one backend too); counted in
	 * draind_udp_counters. */
	STEER_DATAGRAM,
};

/* mix64 is a bijective 64-bit mixer (the MurmurHash3 finaliser): socket
 * cookies are sequential, slots must not be. */
static __always_inline __u64 mix64(__u64 h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ULL;
	h ^= h >> 33;
	return h;
}

/* flow_hash names the flow of a datagram: its socket and where it was sent. */
static __always_inline __u32 flow_hash(struct bpf_sock_addr *ctx, const struct ep_key *dst)
{
	__u32 w[4];
	__u64 h = bpf_get_socket_cookie(ctx);

	__builtin_memcpy(w, dst->addr, 16);
	h = mix64(h ^ (((__u64)w[0] << 32) | w[1]));
	h = mix64(h ^ (((__u64)w[2] << 32) | w[3]));
	h = mix64(h ^ dst->port);
	return (__u32)(h >> 32);
}

static __always_inline void count_kind(enum steer_kind kind, enum outcome o, enum family_idx f)
{
	if (kind == STEER_DATAGRAM)
		count_in(&draind_udp_counters, o, f);
	else
		count_in(&draind_counters, o, f);
}

/* pick returns a selectable backend of svc_id, or NULL. */
static __always_inline struct backend_val *pick(__u32 svc_id, __u64 now, struct bpf_sock_addr *ctx,
						const struct ep_key *dst, enum steer_kind kind)
{
	struct svc_val *sv;
	struct backend_key bk = {};
	__u32 r;

	if (!svc_id)
		return NULL;
	sv = bpf_map_lookup_elem(&draind_services, &svc_id);
	if (!sv || !sv->count || sv->expires_ns < now)
		return NULL;
	if (kind == STEER_DATAGRAM)
		r = flow_hash(ctx, dst);
	else
		r = bpf_get_prandom_u32();
	bk.svc_id = svc_id;
	bk.gen = sv->gen & 1;
	bk.slot = r % sv->count;
	return bpf_map_lookup_elem(&draind_backends, &bk);
}

static __always_inline int is_v4_mapped(const __u8 *a)
{
	return !(a[0] | a[1] | a[2] | a[3] | a[4] | a[5] | a[6] | a[7] | a[8] |
		 a[9]) && a[10] == 0xff && a[11] == 0xff;
}

static __always_inline int refuse(void)
{
	/* Returning 0 alone fails the call with EPERM; callers and their
	 * retry logic expect what a closed port says, where the kernel can
	 * say it (draind_have_set_retval). */
	if (draind_have_set_retval)
		bpf_set_retval(-ECONNREFUSED);
	return 0;
}

static __always_inline void set_v4_mapped(__u8 *a, __u32 ip4)
{
	a[10] = 0xff;
	a[11] = 0xff;
	__builtin_memcpy(&a[12], &ip4, 4);
}

static __always_inline int same_endpoint(const __u8 *a, __u16 aport, const __u8 *b, __u16 bport)
{
	__u32 x[4], y[4];

	__builtin_memcpy(x, a, 16);
	__builtin_memcpy(y, b, 16);
	return aport == bport && x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3];
}

/* remember records that datagrams from be to this socket must look as if
 * they came from orig, and marks the socket. It returns 0 if it could not;
 * the flow is then not steered: a reply the application would reject is
 * worse than leaving the datagram to kube-proxy. */
static __always_inline int remember(struct bpf_sock_addr *ctx, const struct backend_val *be,
				    const struct ep_key *orig)
{
	struct udp_rev_key rk = {};
	struct backend_val ov = {};
	struct backend_val *cur;

	rk.cookie = bpf_get_socket_cookie(ctx);
	__builtin_memcpy(rk.addr, be->addr, 16);
	rk.port = be->port;
	cur = bpf_map_lookup_elem(&draind_udp_reverse, &rk);
	/* A steady flow finds its translation in place: no write, no lock. */
	if (!cur || !same_endpoint(cur->addr, cur->port, orig->addr, orig->port)) {
		__builtin_memcpy(ov.addr, orig->addr, 16);
		ov.port = orig->port;
		if (bpf_map_update_elem(&draind_udp_reverse, &rk, &ov, BPF_ANY))
			return 0;
	}
	return bpf_sk_storage_get(&draind_udp_sockets, ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE) != 0;
}

/* translation returns what a datagram from (addr, port) to this socket must
 * say it came from, or NULL. */
static __always_inline struct backend_val *translation(struct bpf_sock_addr *ctx, const __u8 *addr,
						       __u16 port)
{
	struct udp_rev_key rk = {};

	rk.cookie = bpf_get_socket_cookie(ctx);
	__builtin_memcpy(rk.addr, addr, 16);
	rk.port = port;
	return bpf_map_lookup_elem(&draind_udp_reverse, &rk);
}

/* use returns be if a UDP flow to it can be recorded for reverse translation
 * (and records it), or NULL: a backend that cannot be used, counted as none. */
static __always_inline struct backend_val *use(struct bpf_sock_addr *ctx, struct backend_val *be,
					       const struct ep_key *dst)
{
	if (be && dst->proto == IPPROTO_UDP && !remember(ctx, be, dst))
		return NULL;
	return be;
}

/* note_connect timestamps a UDP socket's connect() while gone peers exist
 * (draind_sock_state), when its peer is listed gone (a new pod that reused
 * the IP) or the socket has a timestamp from an earlier connect: egress.c
 * never ends a socket that connected after its peer was known gone, and a
 * socket without a timestamp connected before every gone entry that names
 * its peer. Call it with the final destination in ctx. */
static __always_inline void note_connect(struct bpf_sock_addr *ctx, const struct node_state *ns,
					 const struct addr_key *peer)
{
	struct sock_state *ss;

	if (ctx->protocol != IPPROTO_UDP || (ns && !ns->gone))
		return;
	ss = bpf_sk_storage_get(&draind_sock_state, ctx->sk, 0, 0);
	if (!ss) {
		if (!bpf_map_lookup_elem(&draind_gone_peers, peer))
			return;
		ss = bpf_sk_storage_get(&draind_sock_state, ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	}
	if (!ss) {
		/* Without it the socket would pass for older than its peer's
		 * departure: count it, it is the unsafe direction. */
		count_sock(SOCK_EV_NO_STORAGE, ctx->family == 10 /* AF_INET6 */ ? FAMILY_V6 : FAMILY_V4);
		return;
	}
	ss->since_ns = bpf_ktime_get_boot_ns();
	ss->flags = 0;
}

/* note_connect4 and note_connect6 call note_connect with the destination
 * the connect() goes to (after any rewrite). */
static __always_inline void note_connect4(struct bpf_sock_addr *ctx, const struct node_state *ns)
{
	struct addr_key peer = {};

	if (ctx->protocol != IPPROTO_UDP || (ns && !ns->gone))
		return;
	set_v4_mapped(peer.addr, ctx->user_ip4);
	note_connect(ctx, ns, &peer);
}

static __always_inline void note_connect6(struct bpf_sock_addr *ctx, const struct node_state *ns)
{
	struct addr_key peer = {};
	__u32 w[4];

	if (ctx->protocol != IPPROTO_UDP || (ns && !ns->gone))
		return;
	w[0] = ctx->user_ip6[0];
	w[1] = ctx->user_ip6[1];
	w[2] = ctx->user_ip6[2];
	w[3] = ctx->user_ip6[3];
	__builtin_memcpy(peer.addr, w, 16);
	note_connect(ctx, ns, &peer);
}

/* steer decides what happens to a connect() or datagram to dst. Callers check
 * node_draining() first. A UDP rewrite comes with its reverse translation
 * already recorded. */
static __always_inline enum verdict steer(struct bpf_sock_addr *ctx, const struct ep_key *dst,
					  enum family_idx fam, enum steer_kind kind,
					  struct backend_val **out)
{
	struct ep_key key = *dst;
	struct frontend_val *fe;
	struct drain_val *dr;
	struct drain_stats *st;
	__u64 now;

	fe = bpf_map_lookup_elem(&draind_frontends, &key);
	if (fe) {
		now = bpf_ktime_get_boot_ns();
		if (fe->expires_ns < now) {
			count_kind(kind, OUT_EXPIRED, fam);
			return VERDICT_PASS;
		}
		if (fe->flags & FRONTEND_NO_STEER) {
			count_kind(kind, OUT_PASS_NO_STEER, fam);
			return VERDICT_PASS;
		}
		*out = use(ctx, pick(fe->svc_id, now, ctx, dst, kind), dst);
		if (!*out) {
			count_kind(kind, OUT_NO_BACKEND_CLUSTERIP, fam);
			return VERDICT_PASS;
		}
		count_kind(kind, OUT_STEERED_CLUSTERIP, fam);
		return VERDICT_REWRITE;
	}

	dr = find_drain(&key);
	if (!dr)
		return VERDICT_PASS;
	now = bpf_ktime_get_boot_ns();
	if (dr->expires_ns < now) {
		count_kind(kind, OUT_EXPIRED, fam);
		return VERDICT_PASS;
	}
	st = stats_of(&key);
	switch (dr->policy) {
	case POLICY_REFUSE:
		count_kind(kind, OUT_REFUSED, fam);
		if (st)
			__sync_fetch_and_add(&st->refused, 1);
		return VERDICT_REFUSE;
	case POLICY_REWRITE:
		*out = use(ctx, pick(dr->svc_id, now, ctx, dst, kind), dst);
		if (*out) {
			count_kind(kind, OUT_STEERED_PODIP, fam);
			if (st)
				__sync_fetch_and_add(&st->steered, 1);
			return VERDICT_REWRITE;
		}
		count_kind(kind, OUT_NO_BACKEND_PODIP, fam);
		break;
	default:
		count_kind(kind, OUT_PASS_OFF, fam);
		break;
	}
	if (st)
		__sync_fetch_and_add(&st->passed, 1);
	return VERDICT_PASS;
}

#endif /* DRAIND_STEER_H */
