"""The qemu-arm64 image boots under qemu-system-aarch64 (-M virt -cpu cortex-a72) with a blank NVMe disk.

First boot: systemd reaches `running`; Redis, web and worker are active; the root partition grew to
the (enlarged) disk; the NVMe got a partition, a filesystem and the data mount; the setup token was
shown on the serial console; /v1/models on the forwarded port lists the demo model; /setup/ takes the
token and creates the administrator. Second boot: the same machine-id, host key, secret key and data
(the administrator too); the spent token is gone and /setup/ is closed. Slow: a full boot under TCG
emulation takes minutes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import httpx
import pytest

from imagetest import build, raw_image, read_env, test_ssh_key

UBOOT = Path("/usr/lib/u-boot/qemu_arm64/u-boot.bin")
DISK_GIB = 8
DEMO = "smollm2-135m-instruct"
ADMIN_PASSWORD = "correct horse battery 42"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Guest:
    """One qemu-system-aarch64 run; its serial console goes to a log file."""

    def __init__(self, disk: Path, nvme: Path, log: Path):
        self.ssh_port, self.web_port = free_port(), free_port()
        self.log = log
        argv = [
            "nice",
            "-n",
            "19",
            "qemu-system-aarch64",
            "-M",
            "virt",
            "-cpu",
            "cortex-a72",
            "-smp",
            "2",
            "-m",
            "2048",
            "-bios",
            str(UBOOT),
            "-nographic",
            "-monitor",
            "none",
            "-serial",
            f"file:{log}",
            # the disks are copies made for this test: the guest's flushes need not reach the host's disk
            "-drive",
            f"if=none,id=root,format=raw,cache=unsafe,file={disk}",
            "-device",
            "virtio-blk-pci,drive=root",
            "-drive",
            f"if=none,id=data,format=raw,cache=unsafe,file={nvme}",
            "-device",
            "nvme,drive=data,serial=rkmojo0",
            "-device",
            "virtio-rng-pci",
            "-netdev",
            f"user,id=net,hostfwd=tcp:127.0.0.1:{self.ssh_port}-:22,hostfwd=tcp:127.0.0.1:{self.web_port}-:8000",
            "-device",
            "virtio-net-pci,netdev=net",
        ]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def console(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def ssh(self, command: str, timeout: float = 120, check: bool = True) -> str:
        key = test_ssh_key()
        argv = [
            "ssh",
            "-i",
            str(key),
            "-p",
            str(self.ssh_port),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "ConnectTimeout=10",
            "-o",
            "BatchMode=yes",
            "admin@127.0.0.1",
            command,
        ]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(
                f"ssh {command!r} -> {r.returncode}: {r.stdout}{r.stderr}\nconsole tail:\n{self.console()[-3000:]}"
            )
        return r.stdout.strip()

    def wait_for_ssh(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (
                f"qemu exited: {self.proc.stderr.read().decode()}\n{self.console()[-3000:]}"
            )
            if self.ssh_answers():
                return
            time.sleep(5)
        raise AssertionError(f"no SSH after {timeout:.0f} s; console tail:\n{self.console()[-4000:]}")

    def ssh_answers(self) -> bool:
        try:
            return self.ssh("echo up", timeout=30, check=False) == "up"
        except subprocess.TimeoutExpired:
            return False

    def poweroff(self, timeout: float = 300) -> None:
        self.ssh("sudo systemctl poweroff", check=False, timeout=30)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("the guest did not power off") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def get_models(port: int, key: str) -> list[str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return [m["id"] for m in json.load(r)["data"]]


def wait_for_models(guest: Guest, key: str, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            models = get_models(guest.web_port, key)
            if models:
                return models
            last = "empty list"
        except OSError as e:
            last = e
        time.sleep(5)
    raise AssertionError(
        f"/v1/models never listed a model ({last}); worker log:\n"
        + guest.ssh("sudo journalctl -u rkmojo-worker -u rkmojo-web --no-pager -n 60", check=False)
    )


def first_disk_size(guest: Guest, dev: str) -> int:
    return int(guest.ssh(f"lsblk -bndo SIZE {dev}"))


def create_admin_with_the_token(port: int, token: str) -> httpx.Response:
    """The setup page as a browser uses it: the form (CSRF cookie and field), then the POST."""
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
        page = c.get("/setup/")
        assert page.status_code == 200 and 'name="token"' in page.text, page.text[:2000]
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
        return c.post(
            "/setup/",
            data={
                "csrfmiddlewaretoken": csrf,
                "token": token,
                "username": "owner",
                "password1": ADMIN_PASSWORD,
                "password2": ADMIN_PASSWORD,
            },
        )


def browser_pages_are_served(port: int) -> bool:
    """The sign-in page and the pages' own and vendored static files come from the installed wheel."""
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
        page = c.get("/login/")
        assert page.status_code == 200 and "Sign in" in page.text, page.text[:2000]
        for path in ("/static/webui/rkmojo.css", "/static/webui/chat.js", "/static/webui/vendor/htmx-2.0.4.min.js"):
            r = c.get(path)
            assert r.status_code == 200 and r.content, f"{path}: {r.status_code}"
    return True


def admin_signs_in(port: int) -> bool:
    """The administrator signs in to Django's admin with the password given at setup, and as a superuser
    sees the user list (a user without that right gets 403). Over HTTP: the web service is up already,
    where `rkmojo manage shell` would start Django again under emulation."""
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
        page = c.get("/admin/login/")
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert page.status_code == 200 and csrf, page.text[:2000]
        r = c.post(
            "/admin/login/?next=/admin/",
            data={
                "csrfmiddlewaretoken": csrf.group(1),
                "username": "owner",
                "password": ADMIN_PASSWORD,
                "next": "/admin/",
            },
        )
        if r.status_code != 302 or r.headers["location"] != "/admin/":
            return False
        return c.get("/admin/auth/user/").status_code == 200


class Steps:
    """Seconds of each step of the boot test, written beside the build's outputs (tests/phases.py prints
    them at the end of the run): where a slow boot spends its time is in every CI log."""

    def __init__(self, path: Path):
        self.path, self.t0, self.done = path, time.monotonic(), []

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        self.done.append((name, now - self.t0))
        self.t0 = now
        self.path.write_text("".join(f"{n}\t{s:.0f}\n" for n, s in self.done))


@pytest.mark.slow
def test_the_qemu_image_boots_into_a_working_appliance_and_a_second_boot_changes_nothing(tmp_path):
    if shutil.which("qemu-system-aarch64") is None or not UBOOT.exists():
        pytest.skip("needs qemu-system-arm and u-boot-qemu (scripts/setup --test)")
    out = build("qemu-arm64")
    step = Steps(out / "boot-steps.tsv")
    layout = read_env(out / "rkmojo-qemu-arm64.layout.env")
    disk, nvme = tmp_path / "disk.img", tmp_path / "nvme.img"
    subprocess.run(["cp", "--sparse=always", str(raw_image(out, "qemu-arm64")), str(disk)], check=True)
    os.truncate(disk, DISK_GIB * 2**30)  # room for the first boot to grow the root partition into
    with nvme.open("wb") as f:
        f.truncate(2 * 2**30)  # a blank NVMe disk (sparse zeros)

    # --- first boot
    g = Guest(disk, nvme, tmp_path / "console-1.log")
    try:
        g.wait_for_ssh(timeout=900)
        step("first boot: SSH answers")
        state = g.ssh("systemctl is-system-running --wait", timeout=900, check=False)
        assert state == "running", g.ssh("systemctl --failed --no-pager; systemctl list-jobs --no-pager", check=False)
        step("first boot: systemd running")
        assert g.ssh("systemctl is-active redis-server rkmojo-web rkmojo-worker").split() == ["active"] * 3
        # what the roles leave off stays off through the presets systemd applies at a first boot
        units = "apt-daily.timer apt-daily-upgrade.timer rkmojo-pin-frequencies.service"
        assert g.ssh(f"systemctl is-enabled {units}", check=False).split() == ["disabled"] * 3

        part = first_disk_size(g, "/dev/vda1")
        assert part > int(layout["ROOT_SIZE_MIB"]) * 2**20 + 2**30, f"root partition not grown: {part} bytes"
        fs = int(g.ssh("df -B1 --output=size / | tail -1"))
        assert fs > int(layout["ROOT_SIZE_MIB"]) * 2**20 + 2**30, f"root filesystem not grown: {fs} bytes"

        assert g.ssh("findmnt -no SOURCE,FSTYPE /var/lib/rkmojo").split() == ["/dev/nvme0n1p1", "ext4"]
        assert g.ssh("sudo blkid -s LABEL -o value /dev/nvme0n1p1") == "rkmojo-data"
        assert g.ssh("stat -c %U /var/lib/rkmojo") == "rkmojo"

        token = g.ssh("sudo cat /etc/rkmojo/setup-token")
        assert re.fullmatch(r"[A-Za-z0-9]{16,}", token)
        assert f"one-time setup token: {token}" in g.console()

        step("first boot: disks, units, token checked")
        api_key = g.ssh("sudo rkmojo manage apikey create image-test", timeout=300).splitlines()[-1].strip()
        step("first boot: API key created")
        assert DEMO in wait_for_models(g, api_key, timeout=600)
        step("first boot: /v1/models lists the demo model")

        # the token is usable: the setup page creates the administrator with it, once
        r = create_admin_with_the_token(g.web_port, token)
        assert r.status_code == 302 and r.headers["location"] == "/panel/", r.text[:2000]
        assert admin_signs_in(g.web_port)
        assert browser_pages_are_served(g.web_port)
        step("first boot: administrator created with the token")

        before = {
            "machine-id": g.ssh("cat /etc/machine-id"),
            "host key": g.ssh("ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub"),
            "secret": g.ssh("sudo sha256sum /etc/rkmojo/secret.env"),
            "data fs": g.ssh("sudo blkid -s UUID -o value /dev/nvme0n1p1"),
        }
        assert re.fullmatch(r"[0-9a-f]{32}", before["machine-id"])
        g.ssh("sudo -u rkmojo touch /var/lib/rkmojo/kept-across-boots")
        g.poweroff()
        step("first boot: powered off")
    finally:
        g.kill()

    # --- second boot: nothing regenerated, data kept
    g = Guest(disk, nvme, tmp_path / "console-2.log")
    try:
        g.wait_for_ssh(timeout=900)
        step("second boot: SSH answers")
        assert g.ssh("systemctl is-system-running --wait", timeout=900, check=False) == "running"
        step("second boot: systemd running")
        after = {
            "machine-id": g.ssh("cat /etc/machine-id"),
            "host key": g.ssh("ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub"),
            "secret": g.ssh("sudo sha256sum /etc/rkmojo/secret.env"),
            "data fs": g.ssh("sudo blkid -s UUID -o value /dev/nvme0n1p1"),
        }
        assert after == before
        assert g.ssh("test -f /var/lib/rkmojo/kept-across-boots && echo kept") == "kept"
        assert DEMO in wait_for_models(g, api_key, timeout=600)
        # the spent token: removed, not shown again, the page closed; the administrator kept
        assert g.ssh("sudo test -e /etc/rkmojo/setup-token || echo gone") == "gone"
        assert token not in g.console()
        assert httpx.get(f"http://127.0.0.1:{g.web_port}/setup/", timeout=120).status_code == 410
        assert admin_signs_in(g.web_port)
        step("second boot: identity, data, models, administrator kept; token spent")
        g.poweroff()
        step("second boot: powered off")
    finally:
        g.kill()
