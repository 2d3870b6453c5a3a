#!/usr/bin/env bash
# Stage 40: the board's raw disk image. On top of stage 30's provisioned root filesystem: the root
# fstab line, the first-boot growth of the root partition (systemd-repart + x-systemd.growfs),
# /etc/default/u-boot with the board's console and device tree, extlinux.conf from u-boot-update
# (u-boot-menu, which also runs on every later kernel upgrade). Then the GPT disk image without loop
# devices or mounts: sgdisk writes the partition table into a sparse file, mkfs.ext4 -d builds the
# root filesystem in place at ROOT_START_MIB (-E offset), dd puts each bootloader file at its sector.
# Usage: run.sh PROVISIONED_TAR NAME   Env: BOARD (profile name), VENDOR_UBOOT (dir).
# Prints the cached directory: NAME.img (sparse), layout.env.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../lib/common.sh"
provisioned_tar=$1
name=$2
profile=$here/../../boards/$BOARD.conf
# shellcheck source=../../boards/qemu-arm64.conf
. "$profile"
vendor_uboot=${VENDOR_UBOOT:-}
check_board_inputs

key=$(key_of "$(basename "$provisioned_tar")" "$name" "$profile" "$here" ${vendor_uboot:+"$vendor_uboot"})
out=$CACHE/disk-$BOARD-$key
if [ -e "$out" ]; then echo "$out"; exit 0; fi
work=$CACHE/work-disk-$key
trap 'chroot_umount; remove_tree "$work"' EXIT
untar "$provisioned_tar" "$work/root"
root=$work/root

# identifiers derived from the inputs: the same inputs give the same image
uuid() { printf '%s' "$key-$1" | sha256sum | sed -E 's/^(.{8})(.{4}).(.{3}).(.{3})(.{12}).*/\1-\2-4\3-8\4-\5/'; }
part_uuid=$(uuid root-partition)
disk_uuid=$(uuid disk)
fs_uuid=$(uuid root-filesystem)

# --- the board's files in the root filesystem
other_lines=$(grep -v -e '^#' -e '[[:space:]]/[[:space:]]' "$root/etc/fstab" 2>/dev/null || true)
cat > "$root/etc/fstab" <<FSTAB
# <file system> <mount point> <type> <options> <dump> <pass>
PARTUUID=$part_uuid / ext4 defaults,noatime,x-systemd.growfs 0 1
$other_lines
FSTAB
mkdir -p "$root/etc/repart.d"
cp "$here/repart-root.conf" "$root/etc/repart.d/50-root.conf"
cat > "$root/etc/default/u-boot" <<UBOOT
## written by image/stages/40-disk for $BOARD; read by u-boot-update (u-boot-menu)
U_BOOT_ALTERNATIVES="default recovery"
U_BOOT_MENU_LABEL="rkmojo"
U_BOOT_TIMEOUT="20"
U_BOOT_PARAMETERS="rw rootwait console=$CONSOLE"
U_BOOT_FDT="$DTB"
UBOOT
if [ -z "$DTB" ]; then
  # the firmware hands over its own device tree: no fdt/fdtdir line (fdtdir makes U-Boot look for a file)
  echo 'U_BOOT_FDT_DIR="/nonexistent/"' >> "$root/etc/default/u-boot"
fi

ensure_binfmt
chroot_mount "$root"
in_chroot u-boot-update >&2
chroot_umount
grep -q "^[[:space:]]*append root=PARTUUID=$part_uuid " "$root/boot/extlinux/extlinux.conf" \
  || die "extlinux.conf does not boot PARTUUID=$part_uuid: $(cat "$root/boot/extlinux/extlinux.conf")"

# --- the disk image
used_mib=$(du -sxm "$root" | cut -f1)
size_mib=$(( used_mib * 5 / 4 + 256 ))
[ "$size_mib" -ge "$ROOT_SIZE_MIB" ] || size_mib=$ROOT_SIZE_MIB
root_start=$(( ROOT_START_MIB * 2048 ))           # sectors of 512 bytes
total_mib=$(( ROOT_START_MIB + size_mib + 1 ))    # + the backup GPT
img=$work/out/$name.img
mkdir -p "$work/out"
say "stage 40: $name.img, ${total_mib} MiB; root filesystem ${size_mib} MiB (${used_mib} MiB used) at ${ROOT_START_MIB} MiB"
truncate -s "${total_mib}M" "$img"
# partition 1: the root filesystem, GPT type root-arm64 (systemd-repart grows it), legacy-BIOS-bootable
# attribute (U-Boot's distro boot picks that partition for extlinux.conf)
sgdisk --zap-all --disk-guid="$disk_uuid" \
  --new="1:$root_start:+$(( size_mib * 2048 ))" --typecode=1:B921B045-1DF0-41C3-AF44-4C6F280D3FAE \
  --change-name=1:rkmojo-root --partition-guid="1:$part_uuid" --attributes=1:set:2 "$img" >/dev/null
# no orphan_file: vendor 5.10 kernels cannot mount it read-write
"${NICE[@]}" mkfs.ext4 -q -F -L rkmojo-root -U "$fs_uuid" -O ^orphan_file -E offset=$(( root_start * 512 )) \
  -d "$root" "$img" "${size_mib}M" >&2
for f in $UBOOT_FILES; do
  sector=${f%%:*}
  file=$vendor_uboot/${f#*:}
  end=$(( sector * 512 + $(stat -c %s "$file") ))
  [ "$end" -le $(( root_start * 512 )) ] || die "${f#*:} at sector $sector overlaps the root partition"
  dd if="$file" of="$img" bs=512 seek="$sector" conv=notrunc status=none
done
sgdisk --verify "$img" | grep -q 'No problems found' || die "sgdisk --verify $img: $(sgdisk --verify "$img")"
cat > "$work/out/layout.env" <<LAYOUT
BOARD=$BOARD
PART_UUID=$part_uuid
DISK_UUID=$disk_uuid
FS_UUID=$fs_uuid
ROOT_START_MIB=$ROOT_START_MIB
ROOT_SIZE_MIB=$size_mib
UBOOT_FILES="$UBOOT_FILES"
DTB=$DTB
CONSOLE=$CONSOLE
LAYOUT
publish "$work/out" "$out"
echo "$out"
