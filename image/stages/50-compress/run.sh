#!/usr/bin/env bash
# Stage 50: what is published of a disk image: NAME.img.xz, NAME.img.bmap (of the raw image, for
# bmaptool copy), NAME.img.xz.sha256 and NAME.img.sha256.
# Usage: run.sh DISK_DIR NAME   Prints the cached directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../lib/common.sh"
disk_dir=$1
name=$2
# xz -0: measured here on a 1 GB root filesystem, 144 s and 451 MB against 322 s and 409 MB for -3
# (2 cores, shared); XZ_LEVEL=6 for a release
xz_level=${XZ_LEVEL:-0}
key=$(key_of "$(basename "$disk_dir")" "$name" "$xz_level" "$here")
out=$CACHE/compressed-$key
if [ -e "$out" ]; then echo "$out"; exit 0; fi
img=$disk_dir/$name.img
[ -f "$img" ] || die "no $img"

work=$CACHE/work-compress-$key
trap 'remove_tree "$work"' EXIT
mkdir -p "$work"
say "stage 50: bmap, xz -$xz_level, sha256 of $name.img"
"${NICE[@]}" bmaptool -q create -o "$work/$name.img.bmap" "$img"
"${NICE[@]}" xz -T2 "-$xz_level" -c "$img" > "$work/$name.img.xz"
(cd "$work" && sha256sum "$name.img.xz" > "$name.img.xz.sha256")
(cd "$disk_dir" && "${NICE[@]}" sha256sum "$name.img") > "$work/$name.img.sha256"
publish "$work" "$out"
echo "$out"
