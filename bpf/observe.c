// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/*
 * observe.c: a cgroup_skb/ingress hook on the pods' cgroup that counts TCP
 * SYNs (SYN without ACK) arriving at a draining endpoint: the server-side
 * answer to "is anything still trying to reach this pod?". Attaching to the
 * cgroup rather than an interface needs no knowledge of the CNI's device
 * names. It never drops a packet.
 */

#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>

#include "draind.h"

char __license[] SEC("license") = "Dual BSD/GPL";

#define TCP_FLAGS_OFF 13
#define TCP_FLAG_SYN_BIT 0x02
#define TCP_FLAG_ACK_BIT 0x10

SEC("cgroup_skb/ingress")
int draind_observe(struct __sk_buff *skb)
{
	struct ep_key key = {};
	struct drain_val *dr;
	struct drain_stats *st;
	enum family_idx fam;
	__u32 l4off;
	__u8 flags;
	__u16 dport;
	__u64 now;

	/* Every packet to every pod passes here: when nothing drains on this
	 * node, one array lookup and out. */
	if (!node_draining())
		return 1;
	/* For cgroup_skb, offset 0 is the network header. */
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, 0, &ip, sizeof(ip)) < 0)
			return 1;
		if (ip.protocol != IPPROTO_TCP || ip.ihl < 5)
			return 1;
		/* Only the first fragment carries the TCP header. */
		if (ip.frag_off & bpf_htons(0x1fff))
			return 1;
		l4off = ip.ihl * 4;
		key.addr[10] = 0xff;
		key.addr[11] = 0xff;
		__builtin_memcpy(&key.addr[12], &ip.daddr, 4);
		fam = FAMILY_V4;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, 0, &ip6, sizeof(ip6)) < 0)
			return 1;
		/* SYNs carry no extension headers in practice; a SYN that does
		 * is not counted (documented limitation). */
		if (ip6.nexthdr != IPPROTO_TCP)
			return 1;
		l4off = sizeof(ip6);
		__builtin_memcpy(key.addr, &ip6.daddr, 16);
		fam = FAMILY_V6;
	} else {
		return 1;
	}

	if (bpf_skb_load_bytes(skb, l4off + TCP_FLAGS_OFF, &flags, 1) < 0)
		return 1;
	if ((flags & (TCP_FLAG_SYN_BIT | TCP_FLAG_ACK_BIT)) != TCP_FLAG_SYN_BIT)
		return 1;
	if (bpf_skb_load_bytes(skb, l4off + 2, &dport, 2) < 0)
		return 1;
	key.port = bpf_ntohs(dport);
	key.proto = IPPROTO_TCP;

	dr = find_drain(&key);
	if (!dr)
		return 1;
	now = bpf_ktime_get_boot_ns();
	if (dr->expires_ns < now)
		return 1;
	count(OUT_SYN_DRAINING, fam);
	st = stats_of(&key);
	if (st) {
		__sync_fetch_and_add(&st->syns, 1);
		st->last_syn_ns = now;
	}
	return 1;
}
