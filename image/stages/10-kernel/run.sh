#!/usr/bin/env bash
# Stage 10: the kernel in the base root filesystem: Debian's KERNEL_PACKAGE from KERNEL_SUITE, or the
# vendor .debs given with --vendor-kernel; files/ adds a kernel hook that keeps /boot/vmlinuz-*
# uncompressed for U-Boot's booti. The initrd holds MODULES=most (a chroot cannot tell which drivers
# the board needs), and the board's own update-initramfs keeps that setting; but it is built in two
# halves: the emulated mkinitramfs with MODULES=list makes the userspace (busybox, udev, scripts, the
# hooks' modules) in seconds, and initrd-modules.sh adds the modules of MODULES=most natively and packs
# the archive (the emulated run of MODULES=most started several arm64 processes per module: 22 min). This stage comes before the appliance: nothing the roles install
# goes into the initrd (its hooks read /etc/initramfs-tools, /etc/modprobe.d and the fstab lines of
# / and /usr, none of which the roles write), so a change to the project or the roles never rebuilds
# the kernel (~10 min under emulation). Boards with the same kernel share this stage's output.
# Usage: run.sh ROOTFS_TAR   Env: BOARD (profile name), VENDOR_KERNEL (dir). Prints the tarball.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../lib/common.sh"
rootfs_tar=$1
# shellcheck source=../../boards/qemu-arm64.conf
. "$here/../../boards/$BOARD.conf"
vendor_kernel=${VENDOR_KERNEL:-}
check_board_inputs

if [ -n "$vendor_kernel" ]; then
  key=$(key_of "$(basename "$rootfs_tar")" "$here" "$vendor_kernel")
else
  key=$(key_of "$(basename "$rootfs_tar")" "$here" "$KERNEL_SUITE" "$KERNEL_PACKAGE")
fi
out=$CACHE/kernel-$key.tar
if [ -e "$out" ]; then echo "$out"; exit 0; fi
work=$CACHE/work-kernel-$key
trap 'chroot_umount; remove_tree "$work"' EXIT
untar "$rootfs_tar" "$work/root"
root=$work/root
cp -a "$here/files/." "$root/"
echo 'MODULES=most' > "$root/etc/initramfs-tools/conf.d/rkmojo"

say "stage 10: installing the kernel (${vendor_kernel:-$KERNEL_PACKAGE from $KERNEL_SUITE})"
ensure_binfmt
chroot_mount "$root"
in_chroot apt-get update -qq
# INITRD=No: the kernel's initramfs hook leaves the initrd to the steps below. The package's depmod
# is a no-op found first on PATH: it runs natively below (the emulated one reads every module: ~1 min).
mkdir -p "$root/tmp/image-build-bin"
printf '#!/bin/sh\n# image/stages/10-kernel: depmod runs natively after the install\nexit 0\n' > "$root/tmp/image-build-bin/depmod"
chmod 755 "$root/tmp/image-build-bin/depmod"
install_env=(env INITRD=No PATH=/tmp/image-build-bin:/usr/sbin:/usr/bin:/sbin:/bin)
if [ -n "$vendor_kernel" ]; then
  mkdir -p "$root/tmp/vendor-kernel"
  cp "$vendor_kernel"/*.deb "$root/tmp/vendor-kernel/"
  in_chroot "${install_env[@]}" sh -c 'apt-get install -y -qq --no-install-recommends /tmp/vendor-kernel/*.deb' >&2
  rm -rf "$root/tmp/vendor-kernel"
else
  in_chroot "${install_env[@]}" apt-get install -y -qq --no-install-recommends -t "$KERNEL_SUITE" "$KERNEL_PACKAGE" >&2
fi
in_chroot apt-get clean
rm -rf "$root/tmp/image-build-bin"
mapfile -t versions < <(ls "$root/lib/modules")
[ ${#versions[@]} = 1 ] || die "expected one kernel in /lib/modules after installing it, found: ${versions[*]:-none}"
version=${versions[0]}
compgen -G "$root/boot/vmlinuz-$version" >/dev/null || die "no /boot/vmlinuz-$version after installing the kernel"
# the module index files are the same whichever machine writes them
PATH=$PATH:/usr/sbin:/sbin depmod -a -b "$root" -F "$root/boot/System.map-$version" "$version"

say "stage 10: the initrd for $version (userspace emulated, MODULES=most's modules natively)"
t0=$(date +%s)
# the board's configuration (MODULES=most) copied with MODULES=list for the emulated half
rm -rf "$root/tmp/initramfs-list" "$root/tmp/initramfs-work"
cp -a "$root/etc/initramfs-tools" "$root/tmp/initramfs-list"
echo 'MODULES=list' > "$root/tmp/initramfs-list/conf.d/zz-image-build"
mkdir -p "$root/tmp/initramfs-work"
in_chroot env TMPDIR=/tmp/initramfs-work mkinitramfs -k -d /tmp/initramfs-list -o /tmp/initramfs-work/initrd.img \
  "$version" >&2 2> "$work/mkinitramfs.log" || die "mkinitramfs failed: $(tail -20 "$work/mkinitramfs.log")"
chroot_umount
trees=("$root"/tmp/initramfs-work/mkinitramfs_*)
[ ${#trees[@]} = 1 ] && [ -d "${trees[0]}" ] || die "mkinitramfs -k left no working tree: $(tail -20 "$work/mkinitramfs.log")"
rm -f "${trees[0]}/conf/conf.d/zz-image-build"  # the initrd carries the board's configuration
say "stage 10: emulated mkinitramfs (MODULES=list) $(( $(date +%s) - t0 )) s"
"${NICE[@]}" "$here/initrd-modules.sh" "$root" "$version" "${trees[0]}" "$root/boot/initrd.img-$version"
rm -rf "$root/tmp/initramfs-list" "$root/tmp/initramfs-work"
rm -rf "$root/var/lib/apt/lists/"* "$root/var/cache/apt/"*.bin
say "stage 10: initrd $(( $(date +%s) - t0 )) s"
retar "$root" "$out"
echo "$out"
