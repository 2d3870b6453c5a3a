"""The names this machine answers to: Django's `ALLOWED_HOSTS` and the WebSocket origin check.

The list is the host name, `HOST.local` (mDNS), `localhost`, every address of every interface (IPv6
in brackets, as a Host header writes them) and the extra names of `RKMOJO_ALLOWED_HOSTS`. A board's
addresses change (DHCP, a cable plugged in after boot), so the list is computed again when it is
older than `REFRESH` seconds; Django (`request.get_host`) and Channels (`OriginValidator`) iterate the
setting on every request, which is what makes a live list work. Interface addresses come from psutil.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import NamedTuple

import psutil

log = logging.getLogger("rkmojo.hosts")

REFRESH = 5.0


def machine_names() -> list[str]:
    """The host name, its .local name, localhost and every interface address of this machine."""
    host = socket.gethostname().lower()
    names = {host, f"{host}.local", "localhost", "127.0.0.1", "[::1]"}
    try:
        interfaces = psutil.net_if_addrs()  # getifaddrs(3): needs AF_NETLINK (the board's sandbox allows it)
    except OSError as e:
        log.warning("cannot list the network interfaces (%s); allowing the host name's addresses only", e)
        interfaces = {"resolved": [_Addr(socket.AF_INET, a) for a in _resolved(host)]}
    for addrs in interfaces.values():
        for a in addrs:
            if a.family == socket.AF_INET:
                names.add(a.address)
            elif a.family == socket.AF_INET6:
                names.add(f"[{a.address.split('%')[0]}]")  # a link-local zone is not part of a Host header
    return sorted(names)


class _Addr(NamedTuple):
    family: int
    address: str


def _resolved(host: str) -> list[str]:
    try:
        return socket.gethostbyname_ex(host)[2]
    except OSError:
        return []


class MachineHosts(list):
    """A list of allowed hosts that refreshes itself: the machine's names plus fixed `extra` names."""

    def __init__(self, extra: list[str]):
        super().__init__()
        self.extra = [e.lower() for e in extra]
        self._at = -REFRESH
        self._lock = threading.Lock()

    def _current(self) -> list[str]:
        if time.monotonic() - self._at >= REFRESH:
            with self._lock:
                fresh = sorted(set(machine_names()) | set(self.extra))
                super().clear()
                super().extend(fresh)
                self._at = time.monotonic()
        return list(super().__iter__())

    def __iter__(self):
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())

    def __contains__(self, item) -> bool:
        return item in self._current()

    def __repr__(self) -> str:
        return f"MachineHosts({self._current()!r})"
