# Shared by image/build and its stages (sourced, never run): logging, the input-hash cache, chroot helpers.
# shellcheck shell=bash

say() { printf '%s image: %s\n' "$(date +%T)" "$*" >&2; }
die() { printf 'image: error: %s\n' "$*" >&2; exit 1; }

# A stage stopped by a signal still runs its EXIT trap (unmounts, removes its work directory); PIPE
# too: a stage whose reader died (a killed image/build or test) is stopped by its next message.
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 141' PIPE
trap 'exit 143' TERM

# Heavy steps yield the CPU to everything else on the machine (emulated dpkg, pip, compression).
NICE=(nice -n 19 ionice -c3)

# Part of every stage's key. This library is not hashed into the keys (a change to a helper would
# rebuild everything, the 20-minute base included): bump this when a change here alters what a stage
# produces.
IMAGE_CACHE_EPOCH=1

# key_of STRING... FILE_OR_DIR...: a short hash of strings and the contents (and names) of files, so a
# stage's output is reused exactly when what goes into it is unchanged.
key_of() {
  local item
  for item in "epoch:$IMAGE_CACHE_EPOCH" "$@"; do
    if [ -d "$item" ]; then
      (cd "$item" && find . -type f ! -name '*.pyc' -print0 | LC_ALL=C sort -z | xargs -0r sha256sum)
    elif [ -f "$item" ]; then
      printf '%s\n' "$(basename "$item")"; sha256sum < "$item"
    else
      printf 'str:%s\n' "$item"
    fi
  done | sha256sum | cut -c1-16
}

# tree_files DIR PATH...: the files under PATHs of the git checkout DIR as git lists them (tracked and
# new, not ignored: no caches, no local inventory), NUL-separated, sorted.
tree_files() {
  local dir=$1
  shift
  git -C "$dir" ls-files -coz --exclude-standard -- "$@" | LC_ALL=C sort -zu |
    while IFS= read -r -d '' f; do [ ! -f "$dir/$f" ] || printf '%s\0' "$f"; done  # not deleted ones
}

# tree_key DIR PATH...: a short hash of those files' names and contents (a clean clone of the same
# commit gives the same key).
tree_key() {
  local dir=$1 files
  files=$(tree_files "$@" | tr '\0' '\n')
  [ -n "$files" ] || die "no files under ${*:2} in $dir (is it a git checkout?)"
  tree_files "$@" | (cd "$dir" && xargs -0 sha256sum) | sha256sum | cut -c1-16
}

# kill_tree PID: TERM to a process and all its descendants, children first found, so that each stage's
# EXIT trap (unmount, remove its work directory) runs.
kill_tree() {
  local child
  for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do kill_tree "$child"; done
  kill -TERM "$1" 2>/dev/null || true
}

# uses ENTRY...: records cache entries this build needs besides the stages' outputs (image/build keeps the
# latest build's entries of every board and prunes the rest).
uses() {
  [ -z "${CACHE_USED:-}" ] || printf '%s\n' "$@" >> "$CACHE_USED"
}

# Mount what a chroot needs for package scripts and Ansible; undone by chroot_umount (also on exit).
CHROOT_MOUNTS=()
chroot_mount() {
  local root=$1 m
  for m in proc sys dev dev/pts; do
    mkdir -p "$root/$m"
    mountpoint -q "$root/$m" && continue
    case $m in
      proc) mount -t proc proc "$root/proc" ;;
      sys) mount -t sysfs sysfs "$root/sys" ;;
      dev) mount --bind /dev "$root/dev" ;;
      dev/pts) mount -t devpts devpts "$root/dev/pts" ;;
    esac
    CHROOT_MOUNTS=("$root/$m" "${CHROOT_MOUNTS[@]}")
  done
  # package scripts must not start daemons in the build chroot
  printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
  chmod 755 "$root/usr/sbin/policy-rc.d"
  # name resolution for apt and pip inside the chroot, put back afterwards
  if [ -e "$root/etc/resolv.conf" ] || [ -L "$root/etc/resolv.conf" ]; then
    mv "$root/etc/resolv.conf" "$root/etc/resolv.conf.image-build"
  fi
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  CHROOT_ROOT=$root
}

chroot_umount() {
  local m
  for m in "${CHROOT_MOUNTS[@]}"; do
    umount -l "$m" 2>/dev/null || true
  done
  CHROOT_MOUNTS=()
  for m in "${NATIVE_MADE[@]}"; do
    if [ -d "$m" ]; then rmdir "$m" 2>/dev/null || true; else rm -f "$m"; fi
  done
  NATIVE_MADE=()
  if [ -n "${CHROOT_ROOT:-}" ]; then
    rm -f "$CHROOT_ROOT/usr/sbin/policy-rc.d" "$CHROOT_ROOT/etc/resolv.conf"
    if [ -e "$CHROOT_ROOT/etc/resolv.conf.image-build" ] || [ -L "$CHROOT_ROOT/etc/resolv.conf.image-build" ]; then
      mv "$CHROOT_ROOT/etc/resolv.conf.image-build" "$CHROOT_ROOT/etc/resolv.conf"
    fi
    CHROOT_ROOT=
  fi
}

# native_in_chroot ROOT PATH[=AT]...: lets the build machine's own (x86_64) programs run inside the
# arm64 chroot without emulation, by giving it the x86_64 loader and libraries read-only where the
# loader looks for them (/lib64, /usr/lib/x86_64-linux-gnu: paths an arm64 Debian leaves empty, by
# multiarch), and each PATH (a file or directory of the build machine) bound read-only at AT in ROOT
# (default: the same path).
# chroot_umount undoes the mounts and removes the mount points it made. Returns 1, binding nothing,
# where the build machine is not x86_64 or ROOT has something of its own at one of those paths.
NATIVE_MADE=()
native_in_chroot() {
  local root=$1 spec src at
  shift
  [ "$(uname -m)" = x86_64 ] || return 1
  for spec in /lib64 /usr/lib/x86_64-linux-gnu "$@"; do
    src=${spec%%=*} at=$root${spec#*=}
    [ -e "$src" ] || return 1
    if [ -L "$at" ] || { [ -e "$at" ] && ! mountpoint -q "$at"; }; then return 1; fi
  done
  for spec in /lib64 /usr/lib/x86_64-linux-gnu "$@"; do
    src=${spec%%=*} at=$root${spec#*=}
    mountpoint -q "$at" && continue
    if [ -d "$src" ]; then mkdir -p "$at"; else mkdir -p "$(dirname "$at")"; : > "$at"; fi
    NATIVE_MADE=("$at" "${NATIVE_MADE[@]}")
    mount --bind "$(realpath "$src")" "$at"
    mount -o remount,bind,ro "$at"
    CHROOT_MOUNTS=("$at" "${CHROOT_MOUNTS[@]}")
  done
}

in_chroot() {
  local root=$1 p
  shift
  [ "$(uname -m)" = x86_64 ] || return 1
  for p in /lib64 /usr/lib/x86_64-linux-gnu "$@"; do
    [ ! -e "$root$p" ] || mountpoint -q "$root$p" || [ -d "$root$p" ] && [ -z "$(ls -A "$root$p")" ] || return 1
  done
  for p in /lib64 /usr/lib/x86_64-linux-gnu "$@"; do
    mountpoint -q "$root$p" && continue
    if [ -d "$p" ]; then mkdir -p "$root$p"; else mkdir -p "$(dirname "$root$p")"; touch "$root$p"; fi
    mount --bind -o ro "$(realpath "$p")" "$root$p"
    mount -o remount,bind,ro "$root$p"
    CHROOT_MOUNTS=("$root$p" "${CHROOT_MOUNTS[@]}")
  done
}

in_chroot() { "${NICE[@]}" chroot "$CHROOT_ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"; }

# remove_tree DIR: rm -rf of a work directory, after unmounting what a killed run left mounted below
# it (a chroot's /proc, /sys, /dev and the wheelhouse's bind mount), so that the /dev bind mount is
# never emptied; refuses when something stays mounted.
remove_tree() {
  [ -e "$1" ] || return 0
  local dir m
  dir=$(realpath "$1")
  for m in $(awk -v d="$dir/" 'index($2 "/", d) == 1 { print $2 }' /proc/self/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  if awk -v d="$dir/" '{ if (index($2 "/", d) == 1) found = 1 } END { exit !found }' /proc/self/mounts; then
    die "$dir still has mounts below it; unmount them first (grep '$dir' /proc/self/mounts)"
  fi
  rm -rf --one-file-system "$dir"
}

# untar TAR DIR: a fresh copy of a cached root filesystem to work in.
untar() {
  remove_tree "$2"; mkdir -p "$2"
  "${NICE[@]}" tar -C "$2" --numeric-owner --xattrs --xattrs-include='*' -xf "$1"
}

# retar DIR TAR: the root filesystem as a cache entry (written aside, then renamed: complete or absent).
retar() {
  "${NICE[@]}" tar -C "$1" --numeric-owner --xattrs --xattrs-include='*' -cf "$2.part" .
  mv "$2.part" "$2"
}

# publish DIR ENTRY: a finished directory becomes the cache entry ENTRY in one rename (complete or
# absent; a run that fails before it leaves the cache as it was).
publish() {
  mv -T "$1" "$2"
}

# binfmt for arm64 binaries (qemu-user-static); this machine needs binfmt_misc mounted first.
ensure_binfmt() {
  [ "$(uname -m)" = aarch64 ] && return 0
  mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64 \
    || die "cannot register qemu-aarch64 with binfmt_misc; install qemu-user-static and binfmt-support"
}

# prune_cache: removes the stage entries (and leftovers of interrupted runs) that no board's latest
# build uses ($CACHE/.used/BOARD lists what each one used). Run under the cache's lock.
prune_cache() {
  local e
  for e in "$CACHE"/{rootfs,kernel,builder,wheeldeps,wheelhouse,provisioned,disk,compressed,work}-*; do
    [ -e "$e" ] || continue
    case $e in
      */work-* | *.part) ;;
      *) grep -qxF "$e" "$CACHE"/.used/* 2>/dev/null && continue ;;
    esac
    say "cache: removing $(basename "$e") (no board's latest build uses it)"
    (remove_tree "$e") || say "cache: left $e in place"
  done
}

# check_board_inputs: after sourcing a board profile, refuse early when a vendor input it needs is
# missing (VENDOR_UBOOT, VENDOR_KERNEL, NPU_VENDOR_DIR: directories given to image/build; NO_NPU_RUNTIME
# the explicit opt-out of librknnrt.so).
check_board_inputs() {
  local f
  if [ "$KERNEL_SOURCE" = vendor ] || [ -n "${VENDOR_KERNEL:-}" ]; then
    compgen -G "${VENDOR_KERNEL:-/nonexistent}/*.deb" >/dev/null || \
      die "board $BOARD: give the vendor kernel's .deb packages with --vendor-kernel DIR"
  fi
  if [ "$UBOOT_SOURCE" = vendor ]; then
    [ -n "${VENDOR_UBOOT:-}" ] || die "board $BOARD needs a vendor U-Boot: give --vendor-uboot DIR holding\
 $(for f in $UBOOT_FILES; do printf '%s ' "${f#*:}"; done)(Debian builds no U-Boot for RK3588; see docs/image.md)"
    for f in $UBOOT_FILES; do
      [ -s "$VENDOR_UBOOT/${f#*:}" ] || die "board $BOARD: $VENDOR_UBOOT/${f#*:} is missing"
    done
  fi
  if [ -n "${NPU_VENDOR_DIR:-}" ] && [ -n "${NO_NPU_RUNTIME:-}" ]; then
    die "give either --npu-vendor DIR or --no-npu-runtime, not both"
  fi
  if [ -n "${NPU_VENDOR_DIR:-}" ]; then
    [ -s "$NPU_VENDOR_DIR/librknnrt.so" ] || die "board $BOARD: $NPU_VENDOR_DIR/librknnrt.so is missing\
 (take it from Rockchip's rknn-toolkit2: rknpu2/runtime/Linux/librknn_api/aarch64/)"
  elif [ "${NPU_RUNTIME:-none}" = vendor ] && [ -z "${NO_NPU_RUNTIME:-}" ]; then
    die "board $BOARD needs the vendor NPU runtime: give --npu-vendor DIR holding librknnrt.so (Rockchip's\
 rknn-toolkit2: rknpu2/runtime/Linux/librknn_api/aarch64/), or --no-npu-runtime for an image whose engine\
 uses the CPU (see docs/npu.md)"
  fi
}
