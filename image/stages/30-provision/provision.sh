#!/usr/bin/env bash
# Applies provisioning/image.yml to an arm64 root filesystem through Ansible's chroot connection.
# Usage: provision.sh [--check] ROOT WHEELHOUSE [EXTRA_VARS_JSON]   (the wheelhouse is mounted
# read-only where the appliance role expects it). Prints Ansible's recap; exits non-zero when the play
# fails. --check runs the play in Ansible's check mode: it reports what a run would change and changes
# nothing (stage 30 runs it right after the real run, to record that a second run changes nothing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../lib/common.sh"
check=()
if [ "${1:-}" = --check ]; then
  check=(--check)
  shift
  echo "provision.sh: check mode (Ansible --check): reports what a run would change, changes nothing"
fi
root=$(realpath "$1")
wheelhouse=$(realpath "$2")
extra=${3:-}
project=${PROJECT:-$(cd "$here/../../.." && pwd)}
playbook_cmd=${ANSIBLE_PLAYBOOK:-$project/.venv/bin/ansible-playbook}
provisioning=$project/provisioning

ensure_binfmt
ansible_tmp=$(mktemp -d)
trap 'umount "$root/var/cache/rkmojo/wheelhouse" 2>/dev/null || true; chroot_umount
  rmdir "$root/opt/native-python/bin" "$root/opt/native-python/lib" "$root/opt/native-python" 2>/dev/null || true
  rm -rf "$ansible_tmp"' EXIT
chroot_mount "$root"
mkdir -p "$root/var/cache/rkmojo/wheelhouse"
mountpoint -q "$root/var/cache/rkmojo/wheelhouse" || mount --bind -o ro "$wheelhouse" "$root/var/cache/rkmojo/wheelhouse"
# the apt module needs package lists (most of the roles' packages are in the base root filesystem)
compgen -G "$root/var/lib/apt/lists/*_Packages" >/dev/null || in_chroot apt-get update -qq

args=(-i "rootfs," -e "ansible_connection=community.general.chroot" -e "ansible_host=$root")
# The modules' Python: the build machine's own where it is Python 3.11 as the board's (same byte code
# and standard library), bound into the chroot; native-python.py hands the modules that need the
# board's Python bindings (apt) to the emulated one. Ansible's interpreter_python otherwise.
magic='import importlib.util, sys; sys.stdout.write(importlib.util.MAGIC_NUMBER.hex())'
native_python=/usr/bin/python3.11
if [ -x "$native_python" ] && [ "$("$native_python" -c "$magic")" = "$(in_chroot /usr/bin/python3 -c "$magic")" ] \
  && native_in_chroot "$root" "$native_python=/opt/native-python/bin/python3.11" \
    "/usr/lib/python3.11=/opt/native-python/lib/python3.11" "$here/native-python.py=/opt/native-python/route.py"; then
  args+=(-e '{"ansible_python_interpreter": "/opt/native-python/route.py"}')
  echo "provision.sh: modules run by the build machine's Python 3.11 (apt's by the board's, emulated)"
fi
[ -n "$extra" ] && args+=(-e "@$extra")
cd "$provisioning"
# a clean environment: the chroot connection hands Ansible's own to every command in the chroot;
# profile_tasks lists the slowest tasks at the end (everything runs under emulation)
"${NICE[@]}" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="${HOME:-/root}" LANG=C.UTF-8 \
  ANSIBLE_CONFIG="$provisioning/ansible.cfg" ANSIBLE_LOCAL_TEMP="$ansible_tmp" ANSIBLE_NOCOLOR=1 \
  ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks PROFILE_TASKS_TASK_OUTPUT_LIMIT=12 \
  "$playbook_cmd" "${check[@]}" "${args[@]}" image.yml
