#!/usr/bin/env bash
# Stage 00: the Debian arm64 base root filesystem (mmdebstrap; emulated dpkg, ~20 min cold).
# Prints the cached tarball's path. Inputs: this folder, DEBIAN_SUITE, DEBIAN_MIRROR, DEBIAN_SECURITY.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../lib/common.sh"

suite=${DEBIAN_SUITE:-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
components="main non-free-firmware"
key=$(key_of "$suite" "$mirror" "$security" "$here")
out=$CACHE/rootfs-$key.tar
if [ -e "$out" ]; then echo "$out"; exit 0; fi

ensure_binfmt
mapfile -t pkgs < <(sed -e 's/#.*//' "$here/packages" | tr -s ' \t' '\n' | sed '/^$/d')
say "stage 00: mmdebstrap $suite arm64 (${#pkgs[@]} packages) -> $out"
"${NICE[@]}" mmdebstrap --architectures=arm64 --variant=apt --format=tar \
  --include="$(IFS=,; echo "${pkgs[*]}")" \
  --components="$components" \
  --aptopt='Acquire::Retries "3"' \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-include=/usr/share/locale/locale.alias' \
  --customize-hook='rm -f "$1/etc/ssh/ssh_host_"*' \
  "$suite" "$out.part" \
  "deb $mirror $suite $components" \
  "deb $mirror $suite-updates $components" \
  "deb $mirror $suite-backports $components" \
  "deb $security $suite-security $components"
mv "$out.part" "$out"
echo "$out"
