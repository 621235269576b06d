// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/*
 * egress.c: a cgroup_skb/egress hook on the pods' cgroup that ends connected
 * UDP sockets pinned to a gone pod: a datagram a connected UDP socket sends
 * to its peer, when that peer is a gone pod IP (draind_gone_peers) and the
 * socket connected before the pod was known gone, is dropped, and the send
 * fails with EPERM at once, so the application reconnects, through steering,
 * to a live pod. Without it, its datagrams go into a dead address until the
 * application gives up. (ECONNREFUSED would say it better, but the kernel
 * refuses bpf_set_retval in egress programs, whose return value carries
 * congestion flags; a drop with congestion would make udp_sendmsg report
 * success.)
 *
 * Never an unconnected socket (its datagrams are steered one by one by
 * udp.c, and destroying it would change its source port), never a socket to
 * a pod that is not gone, never one that connected after the departure (a
 * new pod that reused the IP). When no gone entry exists, every packet costs
 * one array lookup.
 */

#include <linux/in.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>

#include "draind.h"

char __license[] SEC("license") = "Dual BSD/GPL";

#define AF_INET 2

SEC("cgroup_skb/egress")
int draind_egress(struct __sk_buff *skb)
{
	struct node_state *ns = node_flags();
	struct addr_key peer = {};
	struct sock_state *ss;
	struct bpf_sock *sk;
	struct gone_val *g;
	enum family_idx fam;
	__u32 w[4];

	if (!ns || !ns->gone)
		return 1;
	sk = skb->sk;
	if (!sk)
		return 1;
	sk = bpf_sk_fullsock(sk);
	if (!sk)
		return 1;
	/* Connected UDP only: its state is ESTABLISHED from connect() on. */
	if (sk->protocol != IPPROTO_UDP || sk->state != BPF_TCP_ESTABLISHED)
		return 1;
	if (sk->family == AF_INET) {
		__u32 ip4 = sk->dst_ip4;

		peer.addr[10] = 0xff;
		peer.addr[11] = 0xff;
		__builtin_memcpy(&peer.addr[12], &ip4, 4);
	} else {
		w[0] = *(const volatile __u32 *)&sk->dst_ip6[0];
		w[1] = *(const volatile __u32 *)&sk->dst_ip6[1];
		w[2] = *(const volatile __u32 *)&sk->dst_ip6[2];
		w[3] = *(const volatile __u32 *)&sk->dst_ip6[3];
		__builtin_memcpy(peer.addr, w, 16);
	}
	g = bpf_map_lookup_elem(&draind_gone_peers, &peer);
	if (!g || g->expires_ns < bpf_ktime_get_boot_ns())
		return 1;

	/* The datagram must go to the connected peer itself: sendto() with an
	 * address on a connected socket sends elsewhere, and is left alone. */
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, 0, &ip, sizeof(ip)) < 0)
			return 1;
		if (__builtin_memcmp(&ip.daddr, &peer.addr[12], 4))
			return 1;
		fam = FAMILY_V4;
	} else {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, 0, &ip6, sizeof(ip6)) < 0)
			return 1;
		if (__builtin_memcmp(&ip6.daddr, peer.addr, 16))
			return 1;
		fam = FAMILY_V6;
	}

	ss = bpf_sk_storage_get(&draind_sock_state, sk, 0, 0);
	if (ss && ss->since_ns >= g->gone_ns) {
		count_sock(SOCK_EV_UDP_SPARED, fam);
		return 1;
	}
	count_sock(SOCK_EV_UDP_REFUSED, fam);
	if (!ss || !(ss->flags & SOCK_ENDED)) {
		count_sock(SOCK_EV_UDP_ENDED, fam);
		if (!ss)
			ss = bpf_sk_storage_get(&draind_sock_state, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
		if (ss)
			ss->flags |= SOCK_ENDED;
	}
	return 0; /* dropped: the send fails with EPERM */
}
