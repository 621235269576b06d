// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/*
 * udp.c: cgroup/sendmsg4, sendmsg6, recvmsg4 and recvmsg6 hooks that steer
 * unconnected UDP, one datagram at a time, as steer.c steers connections
 * (the decision is steer.h's):
 *
 *  - sendmsg runs for every datagram sent with an address (sendto(),
 *    sendmsg() with msg_name) and rewrites, refuses (ECONNREFUSED from the
 *    send call) or passes it; a rewrite records a reverse translation first
 *    (draind_udp_reverse, draind_udp_sockets);
 *  - recvmsg runs for every datagram received with an address (recvfrom(),
 *    recvmsg() with msg_name) and, if the socket has a translation for the
 *    sender, reports the address the application sent to, so a resolver
 *    that checks the reply's source accepts it.
 *
 * A dual-stack IPv6 socket sending to ::ffff:a.b.c.d runs sendmsg4 (the
 * kernel hands the datagram to the IPv4 path first); its replies run
 * recvmsg6 with the v4-mapped source.
 */

#include "steer.h"

char __license[] SEC("license") = "Dual BSD/GPL";

SEC("cgroup/sendmsg4")
int draind_sendmsg4(struct bpf_sock_addr *ctx)
{
	struct ep_key key = {};
	struct backend_val *be = NULL;
	__u32 ip4;

	if (!node_draining())
		return 1;
	ip4 = ctx->user_ip4;
	set_v4_mapped(key.addr, ip4);
	key.port = bpf_ntohs((__u16)ctx->user_port);
	key.proto = (__u8)ctx->protocol;

	switch (steer(ctx, &key, FAMILY_V4, STEER_DATAGRAM, &be)) {
	case VERDICT_REFUSE:
		return refuse();
	case VERDICT_REWRITE:
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

SEC("cgroup/sendmsg6")
int draind_sendmsg6(struct bpf_sock_addr *ctx)
{
	struct ep_key key = {};
	struct backend_val *be = NULL;
	__u32 w[4];

	if (!node_draining())
		return 1;
	w[0] = ctx->user_ip6[0];
	w[1] = ctx->user_ip6[1];
	w[2] = ctx->user_ip6[2];
	w[3] = ctx->user_ip6[3];
	__builtin_memcpy(key.addr, w, 16);
	/* v4-mapped destinations reach sendmsg4 instead; one here would be
	 * unusual, and the kernel refuses a rewrite to one: leave it alone. */
	if (is_v4_mapped(key.addr))
		return 1;
	key.port = bpf_ntohs((__u16)ctx->user_port);
	key.proto = (__u8)ctx->protocol;

	switch (steer(ctx, &key, FAMILY_V6, STEER_DATAGRAM, &be)) {
	case VERDICT_REFUSE:
		return refuse();
	case VERDICT_REWRITE:
		if (!be || is_v4_mapped(be->addr))
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

SEC("cgroup/recvmsg4")
int draind_recvmsg4(struct bpf_sock_addr *ctx)
{
	struct backend_val *orig;
	__u8 addr[16] = {};
	__u32 ip4;

	/* Sockets that never sent through steering stop here. */
	if (!bpf_sk_storage_get(&draind_udp_sockets, ctx->sk, 0, 0))
		return 1;
	ip4 = ctx->user_ip4;
	set_v4_mapped(addr, ip4);
	orig = translation(ctx, addr, bpf_ntohs((__u16)ctx->user_port));
	if (!orig || !is_v4_mapped(orig->addr))
		return 1;
	__builtin_memcpy(&ip4, &orig->addr[12], 4);
	ctx->user_ip4 = ip4;
	ctx->user_port = bpf_htons(orig->port);
	return 1;
}

SEC("cgroup/recvmsg6")
int draind_recvmsg6(struct bpf_sock_addr *ctx)
{
	struct backend_val *orig;
	__u8 addr[16];
	__u32 w[4];

	if (!bpf_sk_storage_get(&draind_udp_sockets, ctx->sk, 0, 0))
		return 1;
	w[0] = ctx->user_ip6[0];
	w[1] = ctx->user_ip6[1];
	w[2] = ctx->user_ip6[2];
	w[3] = ctx->user_ip6[3];
	__builtin_memcpy(addr, w, 16);
	/* An IPv4 datagram on a dual-stack socket arrives v4-mapped, and its
	 * translation (written by sendmsg4) is v4-mapped too. */
	orig = translation(ctx, addr, bpf_ntohs((__u16)ctx->user_port));
	if (!orig || is_v4_mapped(orig->addr) != is_v4_mapped(addr))
		return 1;
	__builtin_memcpy(w, orig->addr, 16);
	ctx->user_ip6[0] = w[0];
	ctx->user_ip6[1] = w[1];
	ctx->user_ip6[2] = w[2];
	ctx->user_ip6[3] = w[3];
	ctx->user_port = bpf_htons(orig->port);
	return 1;
}
