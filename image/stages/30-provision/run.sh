#!/usr/bin/env bash
# Stage 30: stage 10's root filesystem (base + kernel) provisioned by provisioning/image.yml (the same
# roles as a running board gets). Prints the cached tarball's path.
# Usage: run.sh KERNEL_TAR WHEELHOUSE_DIR   Env: SSH_KEYS_FILE (authorized_keys for the admin user),
# NPU_VENDOR_DIR (holding librknnrt.so), HOSTNAME_BASE.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../lib/common.sh"
kernel_tar=$1
wheelhouse=$2
project=${PROJECT:-$(cd "$here/../../.." && pwd)}
ssh_keys=${SSH_KEYS_FILE:-}
npu_vendor=${NPU_VENDOR_DIR:-}
[ -z "$ssh_keys" ] || [ -s "$ssh_keys" ] || die "SSH keys file $ssh_keys is missing or empty"
[ -z "$npu_vendor" ] || [ -f "$npu_vendor/librknnrt.so" ] || \
  die "$npu_vendor has no librknnrt.so (take it from Rockchip's rknn-toolkit2: rknpu2/runtime/Linux/librknn_api/aarch64/)"

roles_key=$(tree_key "$project" provisioning)
key=$(key_of "$(basename "$kernel_tar")" "$(basename "$wheelhouse")" "$here" "provisioning:$roles_key" \
  "${HOSTNAME_BASE:-rkmojo}" ${ssh_keys:+"$ssh_keys"} ${npu_vendor:+"$npu_vendor"})
out=$CACHE/provisioned-$key.tar
vars_json=${out%.tar}.vars.json  # the variables it was provisioned with
second_run=${out%.tar}.second-run.log  # the play run again in check mode on the result: what it would change
uses "$vars_json" "$second_run"
if [ -e "$out" ]; then echo "$out"; exit 0; fi

work=$CACHE/work-provision-$key
trap 'remove_tree "$work"' EXIT
untar "$kernel_tar" "$work/root"
python3 - "$work/vars.json" "$ssh_keys" "$npu_vendor" "${HOSTNAME_BASE:-rkmojo}" <<'PY'
import json, sys
out, keys, vendor, host = sys.argv[1:]
v = {"base_hostname": host}
if keys:
    v["base_admin_user"] = "admin"
    v["base_ssh_authorized_keys"] = [l.strip() for l in open(keys) if l.strip() and not l.startswith("#")]
if vendor:
    v["npu_vendor_dir"] = vendor
else:  # a board without an NPU, or an explicit --no-npu-runtime (image/build refuses anything else)
    v["npu_install_runtime"] = False
json.dump(v, open(out, "w"))
PY
say "stage 30: applying provisioning/image.yml in the root filesystem (chroot connection)"
"$here/provision.sh" "$work/root" "$wheelhouse" "$work/vars.json" >&2
# Idempotence, recorded for tests/image/test_provisioning.py: the same play in check mode on the tree
# it just provisioned reports what a second run would change (it should be nothing), without a second
# copy of the tree and without changing this one.
say "stage 30: the play again in check mode (a second run must change nothing)"
"$here/provision.sh" --check "$work/root" "$wheelhouse" "$work/vars.json" > "$work/second-run.log" 2>&1 \
  || die "image.yml in check mode failed on the provisioned tree: $(tail -40 "$work/second-run.log")"
# The venv's byte code (image.yml has pip skip it): the build machine's Python is ~20x faster than the
# emulated one and writes the same .pyc when its magic number is the board's (Python 3.11 on both).
venv_lib=$work/root/opt/rkmojo/lib  # the appliance role's appliance_venv
magic='import importlib.util, sys; sys.stdout.write(importlib.util.MAGIC_NUMBER.hex())'
if [ "$(/usr/bin/python3 -c "$magic")" = "$(chroot "$work/root" /usr/bin/python3 -c "$magic")" ]; then
  say "stage 30: byte-compiling the venv with the build machine's Python"
  "${NICE[@]}" /usr/bin/python3 -m compileall -q -j0 -s "$work/root" -p / "$venv_lib" >&2
else
  say "stage 30: byte-compiling the venv with the board's Python (emulated; the build machine's differs)"
  "${NICE[@]}" chroot "$work/root" /usr/bin/python3 -m compileall -q /opt/rkmojo/lib >&2
fi
# no package lists or caches in the image
rm -rf "$work/root/var/lib/apt/lists/"* "$work/root/var/cache/apt/"*.bin "$work/root/root/.ansible"
cp "$work/vars.json" "$vars_json"
cp "$work/second-run.log" "$second_run"
retar "$work/root" "$out"
echo "$out"
