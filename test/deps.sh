#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages the tests need that this machine lacks
# (nothing when everything is there). Both `test/run` and `.ci/run` call it,
# so the README's test command works on a fresh machine with only Go.
#
#   test/deps.sh            # install what is missing (root; apt-get)
#   test/deps.sh --check    # only list what is missing, exit 1 if anything is
#
# The demo (go run ./cmd/draind-demo) needs none of these.
set -euo pipefail

# What each package is for:
#   clang-15 llvm-15 libbpf-dev linux-libc-dev: go generate ./bpf/... (CI checks the committed objects)
#   iptables: the test/cluster module's real kube-proxy, the bpf benchmark's kube-proxy path
#   nftables: kube-proxy's nftables mode (it runs the nft command) in test/cluster/realnode
#   conntrack: the conntrack benchmark's `conntrack -D` baseline
#   iproute2: root-only tests that run `ip` in a test namespace
#   util-linux: setpriv (conntrack runs with CAP_NET_ADMIN only)
#   curl, busybox: the documented preStop recipes (README, docs/prestop.md), run as printed from a test pod
#   curl, busybox, netcat-openbsd, wget, dash, bind9-dnsutils (dig): the upstream e2e suite's
#     images (test/cluster/realnode, docs/conformance.md), copied from the host with their libraries
#   ca-certificates: go module downloads
#   containerd runc containernetworking-plugins: the real node of test/cluster/realnode
#   qemu-system-x86 debian-archive-keyring kmod: the kernel matrix (test/kernels boots
#     Debian's own kernels, downloaded from Debian's archive with a private apt
#     configuration; depmod orders their modules)
#   prometheus: promtool (alert rules checked and unit-tested, deploycheck's TestAlertRules)
pkgs=(clang-15 llvm-15 libbpf-dev linux-libc-dev iptables nftables conntrack iproute2 util-linux curl busybox netcat-openbsd wget dash bind9-dnsutils ca-certificates
      containerd runc containernetworking-plugins qemu-system-x86 debian-archive-keyring kmod prometheus)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  echo "missing Debian packages: ${missing[*]}" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${missing[*]} (run as root to install them, or: apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "installing missing Debian packages: ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
