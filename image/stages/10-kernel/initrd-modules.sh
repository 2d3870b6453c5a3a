#!/usr/bin/env bash
# Completes an initramfs working tree with the kernel modules of MODULES=most, on the build machine
# without emulation, then packs it as mkinitramfs does. The emulated mkinitramfs spends almost all of
# its time starting arm64 processes, several per module (cp, mkdir, readlink, modinfo, xz); the module
# files themselves are data that the build machine's kmod, find and xz read the same way.
#
# Usage: initrd-modules.sh ROOT VERSION WORKDIR OUTPUT
#   ROOT     the root filesystem whose /lib/modules/VERSION (with its depmod output) and
#            /usr/share/initramfs-tools/hook-functions are used
#   WORKDIR  the working tree `mkinitramfs -k` left (MODULES=list: userspace, scripts, hooks' modules)
#   OUTPUT   the initrd to write (in ROOT's /boot), compressed as ROOT's initramfs.conf says
#
# Which modules: the root filesystem's own hook-functions decide: its auto_add_modules (MODULES=most's
# list: base, net, ide, scsi, block, ata, mmc, usb_storage, ... with their exclusions) runs here, with
# manual_add_modules replaced by one that only names the modules. Dependencies come from the root's
# modules.dep (modprobe --show-depends, with and without --ignore-install as hook-functions does),
# firmware from modinfo, as hook-functions would copy them; modules are decompressed and depmod runs
# on the tree, as mkinitramfs does.
set -euo pipefail
root=$(realpath "$1")
version=$2
tree=$(realpath "$3")
output=$4
PATH=$PATH:/usr/sbin:/sbin
die() { printf 'initrd-modules: error: %s\n' "$*" >&2; exit 1; }
modules_dir=/lib/modules/$version
[ -f "$root$modules_dir/modules.dep" ] || die "no $modules_dir/modules.dep in $root (depmod did not run)"
[ -d "$tree$modules_dir" ] || die "$tree is not a mkinitramfs working tree for $version"
for tool in modprobe modinfo depmod cpio xz zstd; do
  command -v "$tool" >/dev/null || die "missing $tool on the build machine (apt-get install kmod cpio xz-utils zstd)"
done

# hook_names FUNCTION: the module names one of the root's hook-functions asks for, run by the build
# machine's shell against the tree, with manual_add_modules replaced by one that only names them
hook_names() {
  MODULESDIR=$root$modules_dir DESTDIR=$tree verbose=n version=$version sh -c '
    . "$1/usr/share/initramfs-tools/hook-functions"
    manual_add_modules() { [ $# -eq 0 ] || printf "%s\n" "$@"; }
    "$2"' - "$root" "$1" | sort -u
}

# add_modules NAME...: the modules, what they depend on (the root's modules.dep and modprobe
# configuration, with and without --ignore-install as hook-functions does) and their firmware where
# the root has it, copied into the usr-merged tree unless it has them (as hook-functions' copy_file)
copied=0
add_modules() {
  local kos ko dest fw dir
  mapfile -t kos < <(
    { printf '%s\n' "$@" | xargs modprobe "${kmod_opts[@]}" --all --ignore-install --quiet --show-depends || true
      printf '%s\n' "$@" | xargs modprobe "${kmod_opts[@]}" --all --quiet --show-depends || true
    } | awk '$1 == "insmod" { print $2 }' | sed "s|^$root||" | sort -u
  )
  for ko in "${kos[@]}"; do
    dest=$tree/usr${ko#/usr}
    { [ -e "$dest" ] || [ -e "${dest%.*}" ]; } && continue
    mkdir -p "${dest%/*}"
    cp -p "$root$ko" "$dest"
    copied=$((copied + 1))
  done
  for fw in $(printf "$root%s\n" "${kos[@]}" | xargs modinfo -F firmware 2>/dev/null | sort -u); do
    for dir in "/lib/firmware/updates/$version" /lib/firmware/updates "/lib/firmware/$version" /lib/firmware; do
      if [ -e "$root$dir/$fw" ]; then
        mkdir -p "$(dirname "$tree/usr$dir/$fw")"
        cp -pL "$root$dir/$fw" "$tree/usr$dir/$fw"
        break
      fi
    done
  done
}
kmod_opts=(-d "$root" -S "$version" -C "$root/etc/modprobe.d" -C "$root/lib/modprobe.d")

# 1. MODULES=most: what auto_add_modules names, then, as mkinitramfs does next, the hidden
# dependencies of what the tree now holds (hidden_dep_add_modules: dw_mmc-rockchip needs the
# Rockchip io-domain driver, spi-rockchip pl330, ...)
mapfile -t names < <(hook_names auto_add_modules)
[ ${#names[@]} -gt 0 ] || die "auto_add_modules named no module (is $root/usr/share/initramfs-tools/hook-functions there?)"
add_modules "${names[@]}"
[ "$copied" -gt 0 ] || die "modprobe resolved none of the ${#names[@]} modules auto_add_modules named"
mapfile -t hidden < <(hook_names hidden_dep_add_modules)
[ ${#hidden[@]} = 0 ] || add_modules "${hidden[@]}"

# 4. as mkinitramfs: modules decompressed for boot speed, depmod, no *map files
find "$tree$modules_dir" -name '*.ko.xz' -print0 | xargs -0r xz -d
find "$tree$modules_dir" -name '*.ko.zst' -print0 | xargs -0r zstd -q -d --rm
depmod -a -b "$tree" "$version"
rm -f "$tree$modules_dir"/modules.*map

# 5. the archive: newc cpio of the sorted tree, compressed as the root's initramfs.conf says
compress=$(sed -n 's/^COMPRESS=//p' "$root/etc/initramfs-tools/initramfs.conf" "$root"/etc/initramfs-tools/conf.d/* 2>/dev/null | tail -1)
case ${compress:-zstd} in
  zstd) compressor=(zstd -q -9 -T0) ;;
  xz) compressor=(xz --check=crc32 --threads=0) ;;
  gzip) compressor=(gzip -n -9) ;;
  *) die "COMPRESS=$compress in $root/etc/initramfs-tools: only zstd, xz and gzip are handled here" ;;
esac
(cd "$tree" && find . | LC_ALL=C sort | cpio --quiet -o -H newc) | "${compressor[@]}" > "$output.part"
mv "$output.part" "$output"
echo "initrd-modules: $copied modules added (${#names[@]} named by MODULES=most, ${#hidden[@]} as hidden dependencies), $(du -h "$output" | cut -f1) $output" >&2
