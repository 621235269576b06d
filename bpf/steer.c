// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/*
 * steer.c: cgroup/connect4 and cgroup/connect6 hooks that keep new
 * connections away from draining endpoints, at the socket, on the client's
 * node, before a packet exists (the decision is in steer.h, shared with the
 * datagram hooks of udp.c). A UDP socket that connects through steering gets
 * a reverse translation, so recvfrom() on it reports the address it
 * connected to.
 *
 * Existing connections are never touched: this runs only on connect().
 * While gone peers exist, a UDP socket's connect() is timestamped (see
 * note_connect in steer.h).
 */

#include "steer.h"

char __license[] SEC("license") = "Dual BSD/GPL";

SEC("cgroup/connect4")
int draind_connect4(struct bpf_sock_addr *ctx)
{
	struct node_state *ns = node_flags();
	struct ep_key key = {};
	struct backend_val *be = NULL;
	__u32 ip4;

	if (ns && !ns->draining) {
		note_connect4(ctx, ns);
		return 1;
	}
	ip4 = ctx->user_ip4;
	set_v4_mapped(key.addr, ip4);
	key.port = bpf_ntohs((__u16)ctx->user_port);
	key.proto = (__u8)ctx->protocol;

	switch (steer(ctx, &key, FAMILY_V4, STEER_CONNECT, &be)) {
	case VERDICT_REFUSE:
		return refuse();
	case VERDICT_REWRITE:
		/* Service-port ids are per family; a v6 backend here would be a
		 * Go bug, and the safe answer is to leave the socket alone. */
		if (!be || !is_v4_mapped(be->addr))
			break;
		__builtin_memcpy(&ip4, &be->addr[12], 4);
		ctx->user_ip4 = ip4;
		ctx->user_port = bpf_htons(be->port);
		break;
	default:
		break;
	}
	note_connect4(ctx, ns);
	return 1;
}

SEC("cgroup/connect6")
int draind_connect6(struct bpf_sock_addr *ctx)
{
	struct node_state *ns = node_flags();
	struct ep_key key = {};
	struct backend_val *be = NULL;
	__u32 w[4];
	int mapped;

	if (ns && !ns->draining) {
		note_connect6(ctx, ns);
		return 1;
	}
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

	switch (steer(ctx, &key, mapped ? FAMILY_V4 : FAMILY_V6, STEER_CONNECT, &be)) {
	case VERDICT_REFUSE:
		return refuse();
	case VERDICT_REWRITE:
		if (!be || is_v4_mapped(be->addr) != mapped)
			break;
		__builtin_memcpy(w, be->addr, 16);
		ctx->user_ip6[0] = w[0];
		ctx->user_ip6[1] = w[1];
		ctx->user_ip6[2] = w[2];
		ctx->user_ip6[3] = w[3];
		ctx->user_port = bpf_htons(be->port);
		break;
	default:
		break;
	}
	note_connect6(ctx, ns);
	return 1;
}
