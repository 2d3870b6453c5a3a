"""Quick checks of provisioning/ and image/: lint, role conventions, board profiles, refusals."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from imagetest import IMAGE, PROVISIONING

ROLES = sorted(p.name for p in (PROVISIONING / "roles").iterdir() if p.is_dir())
VENV_BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    path = VENV_BIN / name if (VENV_BIN / name).exists() else shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")
    return str(path)


def test_the_roles_are_the_ones_the_design_names():
    assert ROLES == sorted(["base", "storage", "redis", "appliance", "npu", "firewall", "firstboot"])


def test_provisioning_passes_yamllint():
    r = subprocess.run([tool("yamllint"), "-s", "."], cwd=PROVISIONING, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_provisioning_passes_ansible_lint_with_the_production_profile():
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(PROVISIONING / "ansible.cfg"),
        "NO_COLOR": "1",
        "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
    }
    r = subprocess.run(
        [tool("ansible-lint"), "--profile", "production", "--offline"],
        cwd=PROVISIONING,
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


@pytest.mark.parametrize("role", ROLES)
def test_every_default_is_prefixed_with_its_role_name(role):
    defaults = yaml.safe_load((PROVISIONING / "roles" / role / "defaults" / "main.yml").read_text())
    assert defaults, f"{role} has no defaults"
    assert [k for k in defaults if not k.startswith(f"{role}_")] == []


@pytest.mark.parametrize("role", ROLES)
def test_every_template_is_headed_by_ansible_managed(role):
    for t in (PROVISIONING / "roles" / role / "templates").glob("*.j2"):
        head = "\n".join(t.read_text().splitlines()[:3])
        assert "{{ ansible_managed }}" in head or t.name == "sandbox.j2", t


def test_the_image_playbook_gathers_no_facts_and_starts_nothing():
    (play,) = yaml.safe_load((PROVISIONING / "image.yml").read_text())
    assert play["gather_facts"] is False
    assert play["vars"]["rkmojo_chroot"] is True
    for path in (PROVISIONING / "roles").rglob("*.yml"):
        text = path.read_text()
        assert "ansible_facts" not in text and "ansible_memtotal" not in text, path
        if "state: started" in text or "state: restarted" in text or "state: reloaded" in text:
            assert "manage_running_services" in text, f"{path} (re)starts a service without the chroot guard"


def test_units_are_sandboxed_and_restart_on_failure():
    tpl = PROVISIONING / "roles" / "appliance" / "templates"
    sandbox = (tpl / "sandbox.j2").read_text()
    for line in (
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ReadWritePaths={{ appliance_data_dir }}",
        "UMask=0077",
    ):  # the data directory's files are the service user's alone
        assert line in sandbox
    assert "AF_NETLINK" in sandbox  # appliance.hosts lists the interfaces' addresses for ALLOWED_HOSTS
    assert "-m appliance.serve " in (tpl / "rkmojo-web.service.j2").read_text()  # 413 before the body is read
    for unit in ("rkmojo-web.service.j2", "rkmojo-worker.service.j2"):
        text = (tpl / unit).read_text()
        assert "Restart=on-failure" in text and "{% include 'sandbox.j2' %}" in text
    assert "MemoryMax={{ appliance_memory_max }}" in (tpl / "rkmojo-worker.service.j2").read_text()


def profile(board: str) -> dict:
    out = {}
    for line in (IMAGE / "boards" / f"{board}.conf").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" in line:
            k, v = line.split("=", 1)
            out[k] = v.strip('"')
    return out


@pytest.mark.parametrize("board", ["qemu-arm64", "rock5b", "orangepi5-plus"])
def test_each_board_profile_names_kernel_console_bootloader_and_sizes(board):
    p = profile(board)
    for k in (
        "KERNEL_SOURCE",
        "KERNEL_SUITE",
        "KERNEL_PACKAGE",
        "CONSOLE",
        "UBOOT_SOURCE",
        "ROOT_START_MIB",
        "ROOT_SIZE_MIB",
    ):
        assert k in p, f"{board}: {k}"
    assert p["ROOT_START_MIB"] == "16"
    assert p["NPU_RUNTIME"] == ("none" if board == "qemu-arm64" else "vendor")  # RK3588: librknnrt.so
    if board != "qemu-arm64":
        assert p["CONSOLE"] == "ttyS2,1500000"
        assert p["DTB"].startswith("rockchip/rk3588")
        assert p["UBOOT_SOURCE"] == "vendor" and p["UBOOT_FILES"] == "64:u-boot-rockchip.bin"


def test_build_refuses_an_rk3588_board_without_the_vendor_uboot(tmp_path):
    r = subprocess.run([str(IMAGE / "build"), "--board", "rock5b", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode != 0
    assert "needs a vendor U-Boot" in r.stderr and "u-boot-rockchip.bin" in r.stderr


def board_inputs(board: str, **env) -> subprocess.CompletedProcess:
    """check_board_inputs of image/lib/common.sh for a board profile, with image/build's variables."""
    script = f'. "{IMAGE}/lib/common.sh"; BOARD={board}; . "{IMAGE}/boards/{board}.conf"; check_board_inputs'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={**os.environ, **env})


def uboot_dir(tmp_path) -> str:
    (tmp_path / "uboot").mkdir()
    (tmp_path / "uboot" / "u-boot-rockchip.bin").write_bytes(b"\1" * 1024)
    return str(tmp_path / "uboot")


@pytest.mark.parametrize("board", ["rock5b", "orangepi5-plus"])
def test_an_rk3588_board_without_librknnrt_is_refused_naming_the_file_and_the_opt_out(tmp_path, board):
    r = board_inputs(board, VENDOR_UBOOT=uboot_dir(tmp_path))
    assert r.returncode != 0
    assert f"board {board} needs the vendor NPU runtime" in r.stderr and "librknnrt.so" in r.stderr
    assert "--no-npu-runtime" in r.stderr


def test_an_npu_vendor_directory_without_librknnrt_is_refused_naming_the_path(tmp_path):
    (tmp_path / "npu").mkdir()
    r = board_inputs("rock5b", VENDOR_UBOOT=uboot_dir(tmp_path), NPU_VENDOR_DIR=str(tmp_path / "npu"))
    assert r.returncode != 0 and f"{tmp_path / 'npu'}/librknnrt.so is missing" in r.stderr


def test_librknnrt_or_the_explicit_opt_out_passes_and_a_board_without_an_npu_needs_neither(tmp_path):
    (tmp_path / "npu").mkdir()
    (tmp_path / "npu" / "librknnrt.so").write_bytes(b"\x7fELF")
    uboot = uboot_dir(tmp_path)
    assert board_inputs("rock5b", VENDOR_UBOOT=uboot, NPU_VENDOR_DIR=str(tmp_path / "npu")).returncode == 0
    assert board_inputs("rock5b", VENDOR_UBOOT=uboot, NO_NPU_RUNTIME="1").returncode == 0
    assert board_inputs("qemu-arm64").returncode == 0
    both = board_inputs("rock5b", VENDOR_UBOOT=uboot, NPU_VENDOR_DIR=str(tmp_path / "npu"), NO_NPU_RUNTIME="1")
    assert both.returncode != 0 and "not both" in both.stderr


def test_build_refuses_an_rk3588_board_without_librknnrt_before_building(tmp_path):
    r = subprocess.run(
        [str(IMAGE / "build"), "--board", "rock5b", "--vendor-uboot", uboot_dir(tmp_path), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0 and "needs the vendor NPU runtime" in r.stderr and "--npu-vendor DIR" in r.stderr


def npu_role_check(tmp_path, **extra) -> subprocess.CompletedProcess:
    """The npu role's runtime-input tasks alone, on localhost (they change nothing)."""
    play = tmp_path / "check.yml"
    play.write_text(
        "- hosts: localhost\n  connection: local\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.include_role:\n        name: npu\n        tasks_from: runtime-input\n"
    )
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(PROVISIONING / "ansible.cfg"),
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",  # the message on one line
        "NO_COLOR": "1",
    }
    argv = [tool("ansible-playbook"), "-i", "localhost,", str(play), "-e", json.dumps(extra)]
    return subprocess.run(argv, cwd=PROVISIONING, capture_output=True, text=True, env=env, timeout=300)


def test_the_npu_role_refuses_a_missing_librknnrt_naming_the_file(tmp_path):
    r = npu_role_check(tmp_path)
    assert r.returncode != 0 and "npu_vendor_dir is empty" in r.stdout and "npu_install_runtime: false" in r.stdout
    (tmp_path / "npu").mkdir()
    r = npu_role_check(tmp_path, npu_vendor_dir=str(tmp_path / "npu"))
    assert r.returncode != 0 and f"{tmp_path / 'npu'}/librknnrt.so is missing" in r.stdout


def test_the_npu_role_accepts_librknnrt_or_the_explicit_opt_out(tmp_path):
    (tmp_path / "npu").mkdir()
    (tmp_path / "npu" / "librknnrt.so").write_bytes(b"\x7fELF")
    assert npu_role_check(tmp_path, npu_vendor_dir=str(tmp_path / "npu")).returncode == 0
    assert npu_role_check(tmp_path, npu_install_runtime=False).returncode == 0


def test_build_refuses_an_unknown_board(tmp_path):
    r = subprocess.run([str(IMAGE / "build"), "--board", "pi4", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode != 0 and "unknown board pi4" in r.stderr and "rock5b" in r.stderr


def test_scripts_parse():
    scripts = [IMAGE / "build", IMAGE / "flash", IMAGE / "lib" / "common.sh", *IMAGE.glob("stages/*/*.sh")]
    for s in scripts:
        r = subprocess.run(["bash", "-n", str(s)], capture_output=True, text=True)
        assert r.returncode == 0, f"{s}: {r.stderr}"


def test_the_kernel_stage_builds_on_the_base_root_filesystem_alone():
    build = (IMAGE / "build").read_text()
    order = re.findall(
        r'^\s*(?:\w+=\$\()?timed (STAGE_\w+) "\$here/stages/([\w-]+)/run.sh"(.*?)\)?(?: > .*&)?$', build, re.M
    )
    assert sorted(o[1] for o in order) == sorted(p.parent.name for p in IMAGE.glob("stages/*/run.sh"))
    args = {o[1]: o[2].split() for o in order}
    assert args["10-kernel"] == ['"$rootfs"']  # not the provisioned one: the appliance never rebuilds it
    assert args["20-wheelhouse"] == ['"$rootfs"']  # built beside the kernel
    assert args["30-provision"] == ['"$kernel"', '"$wheels"']


def wheel_key(repo: Path) -> str:
    stage = (IMAGE / "stages" / "20-wheelhouse" / "run.sh").read_text()
    paths = re.search(r"^wheel_paths=\((.*)\)$", stage, re.M).group(1)
    r = subprocess.run(
        ["bash", "-c", f'. "{IMAGE}/lib/common.sh"; tree_key "{repo}" {paths}'],
        capture_output=True,
        text=True,
        check=True,
    )
    return r.stdout.strip()


def test_the_wheelhouse_key_covers_what_goes_into_the_wheel_and_nothing_else(tmp_path):
    files = [
        "pyproject.toml",
        "setup.py",
        "README.md",
        "inference/engine.py",
        "inference/kernels/rkkernels.c",
        "appliance/settings.py",
        "webui/templates/webui/setup.html",
        "tests/test_x.py",
        "docs/x.md",
        "benchmarks/b.py",
    ]
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text(f"{f}\n")
    (tmp_path / ".gitignore").write_text("*.so\n")
    (tmp_path / "inference" / "_built.so").write_text("a build product")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    key = wheel_key(tmp_path)
    for f in ["tests/test_x.py", "docs/x.md", "benchmarks/b.py", "README.md", "inference/_built.so"]:
        (tmp_path / f).write_text("changed")
        assert wheel_key(tmp_path) == key, f
    for f in [
        "inference/engine.py",
        "inference/kernels/rkkernels.c",
        "webui/templates/webui/setup.html",
        "setup.py",
        "pyproject.toml",
    ]:
        (tmp_path / f).write_text("changed")
        changed = wheel_key(tmp_path)
        assert changed != key, f
        key = changed


def test_the_cache_keeps_what_each_boards_latest_build_used_and_nothing_else(tmp_path):
    entries = [
        "rootfs-a.tar",
        "kernel-b.tar",
        "wheelhouse-old",
        "wheelhouse-new",
        "provisioned-c.tar",
        "provisioned-c.vars.json",
        "disk-rock5b-d",
        "disk-rock5b-e",
        "compressed-f",
        "work-disk-g",
        "kernel-h.tar.part",
        "test-ssh",
    ]
    for e in entries:
        (tmp_path / e).mkdir() if "." not in e else (tmp_path / e).write_text("x")
    (tmp_path / ".used").mkdir()
    (tmp_path / ".used" / "qemu-arm64").write_text(
        "".join(
            f"{tmp_path / e}\n"
            for e in [
                "rootfs-a.tar",
                "kernel-b.tar",
                "wheelhouse-new",
                "provisioned-c.tar",
                "provisioned-c.vars.json",
                "compressed-f",
            ]
        )
    )
    (tmp_path / ".used" / "rock5b").write_text(f"{tmp_path / 'kernel-b.tar'}\n{tmp_path / 'disk-rock5b-e'}\n")
    subprocess.run(
        ["bash", "-c", f'. "{IMAGE}/lib/common.sh"; CACHE="{tmp_path}"; prune_cache'], check=True, capture_output=True
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [
            ".used",
            "rootfs-a.tar",
            "kernel-b.tar",
            "wheelhouse-new",
            "provisioned-c.tar",
            "provisioned-c.vars.json",
            "disk-rock5b-e",
            "compressed-f",
            "test-ssh",
        ]
    )


def test_flash_refuses_a_file_that_is_not_a_block_device(tmp_path):
    img = tmp_path / "x.img"
    img.write_bytes(b"\0" * 1024)
    r = subprocess.run(
        [str(IMAGE / "flash"), "--yes", str(img), str(tmp_path / "disk")], capture_output=True, text=True
    )
    assert r.returncode != 0 and "not a block device" in r.stderr


def test_flash_refuses_the_disk_the_system_runs_from(tmp_path):
    src = subprocess.run(["findmnt", "-no", "SOURCE", "/"], capture_output=True, text=True).stdout.strip()
    disk = subprocess.run(["lsblk", "-ndpo", "PKNAME", src], capture_output=True, text=True).stdout.strip() or src
    if not Path(disk).is_block_device() or shutil.which("bmaptool") is None:
        pytest.skip(f"/ is on {src!r}, not a disk this test can name")
    img = tmp_path / "x.img"
    img.write_bytes(b"\0" * 1024)
    r = subprocess.run([str(IMAGE / "flash"), "--yes", str(img), disk], capture_output=True, text=True)
    assert r.returncode != 0
    assert "holds the running system" in r.stderr or "mounted" in r.stderr, r.stderr
