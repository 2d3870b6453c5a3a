#!/usr/bin/env bash
# Stage 10: the kernel in the base root filesystem: Debian's KERNEL_PACKAGE from KERNEL_SUITE, or the
# vendor .debs given with --vendor-kernel. initramfs-tools builds the initrd (MODULES=most: a chroot
# cannot tell which drivers the board needs); files/ adds a kernel hook that keeps /boot/vmlinuz-*
# uncompressed for U-Boot's booti. This stage comes before the appliance: nothing the roles install
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
if [ -n "$vendor_kernel" ]; then
  mkdir -p "$root/tmp/vendor-kernel"
  cp "$vendor_kernel"/*.deb "$root/tmp/vendor-kernel/"
  in_chroot sh -c 'apt-get install -y -qq --no-install-recommends /tmp/vendor-kernel/*.deb' >&2
  rm -rf "$root/tmp/vendor-kernel"
else
  in_chroot apt-get install -y -qq --no-install-recommends -t "$KERNEL_SUITE" "$KERNEL_PACKAGE" >&2
fi
in_chroot apt-get clean
chroot_umount
rm -rf "$root/var/lib/apt/lists/"* "$root/var/cache/apt/"*.bin
compgen -G "$root/boot/vmlinuz-*" >/dev/null || die "no kernel in /boot after installing it"
compgen -G "$root/boot/initrd.img-*" >/dev/null || die "no initrd in /boot after installing the kernel"
retar "$root" "$out"
echo "$out"
