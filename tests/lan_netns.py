"""A stand-in LAN for tests: a network namespace joined to this one by a veth pair on a private /30.

From this machine the namespace's address (`ns_ip`, in 10.213/16) is a LAN neighbour: private, and not one
of this machine's own addresses. Clients run inside it (`python`); servers listen inside it (`listen`), a
socket made there by a thread that joined the namespace, then served from this process as usual.
Needs root (ip netns); nothing leaves this machine.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLONE_NEWNET = 0x40000000
_made = itertools.count()


class Lan:
    """A network namespace `ns` reaching this machine at `host_ip` over a veth pair on a /30."""

    def __init__(self):
        n = (os.getpid() * 4 + next(_made)) % 16000  # two in one process get two subnets
        self.ns, self.host_if, self.ns_if = f"rkmojo-t{n}", f"rkh{n}", f"rkn{n}"
        net = f"10.213.{n // 64}.{(n % 64) * 4}"
        base = net.rsplit(".", 1)[0]
        last = int(net.rsplit(".", 1)[1])
        self.host_ip, self.ns_ip = f"{base}.{last + 1}", f"{base}.{last + 2}"

    def up(self) -> "Lan":
        for argv in (
            ["ip", "netns", "add", self.ns],
            ["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if],
            ["ip", "link", "set", self.ns_if, "netns", self.ns],
            ["ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if],
            ["ip", "link", "set", self.host_if, "up"],
            ["ip", "-n", self.ns, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if],
            ["ip", "-n", self.ns, "link", "set", self.ns_if, "up"],
            ["ip", "-n", self.ns, "link", "set", "lo", "up"],
        ):
            subprocess.run(argv, check=True, capture_output=True)
        return self

    def down(self) -> None:
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)

    def python(self, code: str, **args) -> dict:
        """Run `code` (which prints one JSON object) inside the namespace; that object."""
        r = subprocess.run(
            ["ip", "netns", "exec", self.ns, sys.executable, "-c", code, json.dumps(args)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])

    def listen(self, port: int = 0) -> socket.socket:
        """A TCP socket listening at `ns_ip`:`port` inside the namespace (0: any free port)."""
        made: list = []

        def inside():
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                fd = os.open(f"/run/netns/{self.ns}", os.O_RDONLY)
                try:
                    if libc.setns(fd, CLONE_NEWNET) != 0:  # this thread only; it ends below
                        raise OSError(ctypes.get_errno(), f"setns {self.ns}")
                finally:
                    os.close(fd)
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((self.ns_ip, port))
                s.listen(16)
                made.append(s)
            except OSError as e:
                made.append(e)

        t = threading.Thread(target=inside)
        t.start()
        t.join()
        if isinstance(made[0], Exception):
            raise made[0]
        return made[0]
