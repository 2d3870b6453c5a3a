#!/usr/bin/env bash
# Applies provisioning/image.yml to an arm64 root filesystem through Ansible's chroot connection.
# Usage: provision.sh ROOT WHEELHOUSE [EXTRA_VARS_JSON]   (the wheelhouse is mounted read-only where
# the appliance role expects it). Prints Ansible's recap; exits non-zero when the play fails.
# Also used by tests/image to apply the play twice and check the second run changes nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../lib/common.sh"
root=$(realpath "$1")
wheelhouse=$(realpath "$2")
extra=${3:-}
project=${PROJECT:-$(cd "$here/../../.." && pwd)}
playbook_cmd=${ANSIBLE_PLAYBOOK:-$project/.venv/bin/ansible-playbook}
provisioning=$project/provisioning

ensure_binfmt
ansible_tmp=$(mktemp -d)
trap 'umount "$root/var/cache/rkmojo/wheelhouse" 2>/dev/null || true; chroot_umount; rm -rf "$ansible_tmp"' EXIT
chroot_mount "$root"
mkdir -p "$root/var/cache/rkmojo/wheelhouse"
mountpoint -q "$root/var/cache/rkmojo/wheelhouse" || mount --bind -o ro "$wheelhouse" "$root/var/cache/rkmojo/wheelhouse"
# the apt module needs package lists (most of the roles' packages are in the base root filesystem)
compgen -G "$root/var/lib/apt/lists/*_Packages" >/dev/null || in_chroot apt-get update -qq

args=(-i "rootfs," -e "ansible_connection=community.general.chroot" -e "ansible_host=$root")
[ -n "$extra" ] && args+=(-e "@$extra")
cd "$provisioning"
# a clean environment: the chroot connection hands Ansible's own to every command in the chroot;
# profile_tasks lists the slowest tasks at the end (everything runs under emulation)
"${NICE[@]}" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="${HOME:-/root}" LANG=C.UTF-8 \
  ANSIBLE_CONFIG="$provisioning/ansible.cfg" ANSIBLE_LOCAL_TEMP="$ansible_tmp" ANSIBLE_NOCOLOR=1 \
  ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks PROFILE_TASKS_TASK_OUTPUT_LIMIT=12 \
  "$playbook_cmd" "${args[@]}" image.yml
