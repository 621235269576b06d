package bpf

// Regenerate with `go generate ./bpf/...` (needs clang-15 and libbpf-dev from
// Debian). The generated bindings and objects are committed, so go build and
// go test need no clang.
//go:generate -command bpf2go go tool bpf2go -cc clang-15 -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -no-global-types
//go:generate bpf2go -type ep_key -type frontend_val -type svc_val -type backend_key -type backend_val -type drain_val -type drain_stats -type outcome -type drain_policy -type node_state -type udp_rev_key steer steer.c
//go:generate bpf2go udp udp.c
//go:generate bpf2go observe observe.c
//go:generate bpf2go -type addr_key -type conn_count -type gone_val -type flow_key -type sock_state -type sock_event -type sock_info sockops sockops.c
//go:generate bpf2go egress egress.c
