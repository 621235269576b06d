// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/*
 * steer.c: cgroup/connect4 and cgroup/connect6 hooks that keep new
 * connections away from draining endpoints, at the socket, on the client's
 * node, before a packet exists:
 *
 *  - a connect() to a Service frontend whose service-port drains goes to a
 *    random selectable (ready, non-draining) backend of that service-port;
 *  - a connect() to a draining pod IP (a stale registry cache) is rewritten to
 *    a selectable backend of the same service-port, refused with
 *    ECONNREFUSED, or left alone, as the entry's policy says;
 *  - anything else, an expired entry, or no selectable backend leaves the
 *    connect() untouched: the datapath fails open.
 *
 * Existing connections are never touched: this runs only on connect().
 */

#include <linux/in.h>
#include <linux/errno.h>

#include "draind.h"

char __license[] SEC("license") = "Dual BSD/GPL";

enum verdict {
	VERDICT_PASS,
	VERDICT_REWRITE,
	VERDICT_REFUSE,
};

/* pick returns a random selectable backend of svc_id, or NULL. */
static __always_inline struct backend_val *pick(__u32 svc_id, __u64 now)
{
	struct svc_val *sv;
	struct backend_key bk = {};

	if (!svc_id)
		return NULL;
	sv = bpf_map_lookup_elem(&draind_services, &svc_id);
	if (!sv || !sv->count || sv->expires_ns < now)
		return NULL;
	bk.svc_id = svc_id;
	bk.gen = sv->gen & 1;
	bk.slot = bpf_get_prandom_u32() % sv->count;
	return bpf_map_lookup_elem(&draind_backends, &bk);
}

static __always_inline enum verdict steer(struct ep_key *key, enum family_idx fam,
					  struct backend_val **out)
{
	struct frontend_val *fe;
	struct drain_val *dr;
	struct drain_stats *st;
	__u64 now;

	fe = bpf_map_lookup_elem(&draind_frontends, key);
	if (fe) {
		now = bpf_ktime_get_boot_ns();
		if (fe->expires_ns < now) {
			count(OUT_EXPIRED, fam);
			return VERDICT_PASS;
		}
		if (fe->flags & FRONTEND_NO_STEER) {
			count(OUT_PASS_NO_STEER, fam);
			return VERDICT_PASS;
		}
		*out = pick(fe->svc_id, now);
		if (!*out) {
			count(OUT_NO_BACKEND_CLUSTERIP, fam);
			return VERDICT_PASS;
		}
		count(OUT_STEERED_CLUSTERIP, fam);
		return VERDICT_REWRITE;
	}

	dr = find_drain(key);
	if (!dr)
		return VERDICT_PASS;
	now = bpf_ktime_get_boot_ns();
	if (dr->expires_ns < now) {
		count(OUT_EXPIRED, fam);
		return VERDICT_PASS;
	}
	st = stats_of(key);
	switch (dr->policy) {
	case POLICY_REFUSE:
		count(OUT_REFUSED, fam);
		if (st)
			__sync_fetch_and_add(&st->refused, 1);
		return VERDICT_REFUSE;
	case POLICY_REWRITE:
		*out = pick(dr->svc_id, now);
		if (*out) {
			count(OUT_STEERED_PODIP, fam);
			if (st)
				__sync_fetch_and_add(&st->steered, 1);
			return VERDICT_REWRITE;
		}
		count(OUT_NO_BACKEND_PODIP, fam);
		break;
	default:
		count(OUT_PASS_OFF, fam);
		break;
	}
	if (st)
		__sync_fetch_and_add(&st->passed, 1);
	return VERDICT_PASS;
}

static __always_inline int is_v4_mapped(const __u8 *a)
{
	return !(a[0] | a[1] | a[2] | a[3] | a[4] | a[5] | a[6] | a[7] | a[8] |
		 a[9]) && a[10] == 0xff && a[11] == 0xff;
}

static __always_inline int refuse(void)
{
	/* Returning 0 alone would fail connect() with EPERM; callers and their
	 * retry logic expect what a closed port says. */
	bpf_set_retval(-ECONNREFUSED);
	return 0;
}

SEC("cgroup/connect4")
int draind_connect4(struct bpf_sock_addr *ctx)
{
	struct ep_key key = {};
	struct backend_val *be = NULL;
	__u32 ip4;

	if (!node_draining())
		return 1;
	ip4 = ctx->user_ip4;
	key.addr[10] = 0xff;
	key.addr[11] = 0xff;
	__builtin_memcpy(&key.addr[12], &ip4, 4);
	key.port = bpf_ntohs((__u16)ctx->user_port);
	key.proto = (__u8)ctx->protocol;

	switch (steer(&key, FAMILY_V4, &be)) {
	case VERDICT_REFUSE:
		return refuse();
	case VERDICT_REWRITE:
		/* Service-port ids are per family; a v6 backend here would be a
		 * Go bug, and the safe answer is to leave the socket alone. */
		if (!be || !is_v4_mapped(be->addr))
			return 1;
		__builtin_memcpy(&ip4, &be->addr[12], 4);
		ctx->user_ip4 = ip4;
		ctx->user_port = bpf_htons(be->port);
		return 1;
	default:
		return 1;
	}
}

SEC("cgroup/connect6")
int draind_connect6(struct bpf_sock_addr *ctx)
{
	struct ep_key key = {};
	struct backend_val *be = NULL;
	__u32 w[4];
	int mapped;

	if (!node_draining())
		return 1;
	/* user_ip6 only allows 4-byte loads. */
	w[0] = ctx->user_ip6[0];
	w[1] = ctx->user_ip6[1];
	w[2] = ctx->user_ip6[2];
	w[3] = ctx->user_ip6[3];
	__builtin_memcpy(key.addr, w, 16);
	key.port = bpf_ntohs((__u16)ctx->user_port);
	key.proto = (__u8)ctx->protocol;
	/* A dual-stack socket dialing ::ffff:a.b.c.d is an IPv4 connection and
	 * matches the IPv4 entries, which are stored v4-mapped. */
	mapped = is_v4_mapped(key.addr);

	switch (steer(&key, mapped ? FAMILY_V4 : FAMILY_V6, &be)) {
	case VERDICT_REFUSE:
		return refuse();
	case VERDICT_REWRITE:
		if (!be || is_v4_mapped(be->addr) != mapped)
			return 1;
		__builtin_memcpy(w, be->addr, 16);
		ctx->user_ip6[0] = w[0];
		ctx->user_ip6[1] = w[1];
		ctx->user_ip6[2] = w[2];
		ctx->user_ip6[3] = w[3];
		ctx->user_port = bpf_htons(be->port);
		return 1;
	default:
		return 1;
	}
}
