#!/usr/bin/env bash
# Downloads Debian's cloud kernel of one release from Debian's archive with a
# private apt configuration (the machine's own sources and state are not
# touched) and unpacks it into the cache. Prints the unpacked directory.
#
#   test/kernels/fetch.sh bullseye|bookworm|trixie
#
# Cache: ${DRAIND_KERNEL_CACHE:-$HOME/.cache/draind/kernels}/<release>/.
# A release already unpacked is reused; DRAIND_KERNEL_REFRESH=1 asks the
# archive again.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
rel=$1
cache=${DRAIND_KERNEL_CACHE:-$HOME/.cache/draind/kernels}
dir=$cache/$rel
if [ -z "${DRAIND_KERNEL_REFRESH:-}" ] && [ -f "$dir/ready" ]; then
  echo "$dir"
  exit 0
fi
mkdir -p "$dir/apt/state/lists/partial" "$dir/apt/cache/archives/partial" "$dir/apt/etc/apt.conf.d" "$dir/apt/etc/preferences.d"
cat >"$dir/apt/etc/sources.list" <<SRC
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $rel main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security $rel-security main
SRC
: >"$dir/apt/state/status"
aptopts=(-o "Dir::Etc=$dir/apt/etc" -o "Dir::Etc::SourceList=$dir/apt/etc/sources.list"
  -o "Dir::Etc::SourceParts=$dir/apt/etc/sources.list.d" -o "Dir::State=$dir/apt/state"
  -o "Dir::State::status=$dir/apt/state/status" -o "Dir::Cache=$dir/apt/cache"
  -o "APT::Architecture=amd64" -o "Debug::NoLocking=1" -o "Acquire::Languages=none" -o "APT::Sandbox::User=root")
apt-get "${aptopts[@]}" -qq update >&2
# The metapackage names the current kernel of the release.
pkg=$(apt-cache "${aptopts[@]}" depends linux-image-cloud-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
[ -n "$pkg" ] || { echo "no cloud kernel found for $rel" >&2; exit 1; }
rm -rf "$dir/root" "$dir/debs"
mkdir -p "$dir/debs" "$dir/root"
(cd "$dir/debs" && apt-get "${aptopts[@]}" -qq download "$pkg" >&2)
dpkg-deb -x "$dir"/debs/*.deb "$dir/root"
# modules.dep is made by the package's postinst: make it here. Newer
# kernels install their modules under usr/lib.
[ -e "$dir/root/lib" ] || ln -s usr/lib "$dir/root/lib"
ver=$(basename "$(ls -d "$dir"/root/lib/modules/*)")
depmod -b "$dir/root" "$ver"
rm -rf "$dir/debs"
echo "$pkg" >"$dir/package"
touch "$dir/ready"
echo "$dir"
