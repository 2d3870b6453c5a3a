"""Where a URL pull may connect: the address check a service that pulls on behalf of network clients needs.

`PullPolicy` is checked on the address each connection is made to, not on the URL: the host name is resolved
once (`PullPolicy.resolve`), every address it gives is checked, and the socket connects to a checked address
(a DNS answer that changes between the check and the connect, a rebind, never reaches the socket). The
connection classes below are the only way `Remote` connects under a policy, so a redirect's hop is checked
by the same code as the first request. Proxies are not used (a proxy resolves the name itself, past the
check), and only http and https are spoken (urllib's ftp and file handlers are left out of the opener).

The kinds of address (`Kind`):
- public (`is_global`, not multicast): allowed;
- LAN, RFC 1918 (10/8, 172.16/12, 192.168/16), IPv6 ULA (fc00::/7) and carrier-grade NAT (100.64/10, where
  Tailscale puts its peers): allowed when `lan` is set ("my NAS at 192.168.1.10");
- this machine: loopback, link-local, unspecified (0.0.0.0 connects to this machine), and the addresses of
  its interfaces (psutil): always refused — the appliance's Redis, web process and worker live there;
- everything else (multicast, broadcast, documentation, reserved ranges): always refused.
An IPv6 address that carries an IPv4 one (v4-mapped, v4-compatible, NAT64, 6to4) is judged by the IPv4 one.

Errors are one message each, so that a refusal or a failure tells nothing about the port behind it:
`REFUSED` (an address the policy does not allow; nothing is sent to it) and `FAILED` (`http.Remote`: a
connection failed, was reset, timed out, or did not speak HTTP, after the retries).
No policy (`None`, the command line's default) checks nothing: the user at the shell owns the machine.
"""

from __future__ import annotations

import enum
import http.client
import ipaddress
import socket
import ssl
import urllib.request
from dataclasses import dataclass, field
from typing import Callable

import psutil

from ..errors import RkmojoError

REFUSED = "could not download from URL: refused by the pull policy"
FAILED = "could not download from URL: connection failed"

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
LAN_NETWORKS = tuple(
    ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
)
V4_COMPATIBLE, NAT64 = ipaddress.ip_network("::/96"), ipaddress.ip_network("64:ff9b::/96")


class PullRefused(RkmojoError):
    """The pull policy refused an address (the URL's or a redirect's); nothing was sent to it. Never retried."""

    def __init__(self, why: str = ""):
        super().__init__(REFUSED)
        self.why = why  # for the log: which address and why; never shown to the client


def resolve_host(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to (getaddrinfo), in the order a connection tries them."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


def own_addresses() -> set[Address]:
    """The addresses of this machine's interfaces.

    Raises:
        PullRefused: the interfaces cannot be listed (then no address can be told apart from this machine's).
    """
    try:
        interfaces = psutil.net_if_addrs()
    except OSError as e:
        raise PullRefused(f"cannot list this machine's addresses ({e})") from None
    out = set()
    for addrs in interfaces.values():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                out.add(_plain(ipaddress.ip_address(a.address.split("%")[0])))
    return out


def _plain(addr: Address) -> Address:
    """The IPv4 address an IPv6 one carries (v4-mapped, v4-compatible, NAT64's 64:ff9b::/96, 6to4), else itself."""
    if not isinstance(addr, ipaddress.IPv6Address):
        return addr
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if (addr in V4_COMPATIBLE and int(addr) > 1) or addr in NAT64:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return addr


class Kind(enum.Enum):
    PUBLIC = "public"
    LAN = "lan"
    MACHINE = "this machine"
    OTHER = "multicast or reserved"


def kind(addr: Address, own: set[Address]) -> Kind:
    """Which kind of address `addr` is (see the module docstring); `own`: this machine's addresses."""
    addr = _plain(addr)
    if addr.is_loopback or addr.is_link_local or addr.is_unspecified or addr in own:
        return Kind.MACHINE
    if addr.is_multicast:
        return Kind.OTHER
    if any(addr in net for net in LAN_NETWORKS):
        return Kind.LAN
    return Kind.PUBLIC if addr.is_global else Kind.OTHER


@dataclass(frozen=True)
class PullPolicy:
    """The addresses a pull may connect to.

    Args:
        lan: allow private LAN addresses too (RFC 1918, fc00::/7, 100.64/10); public ones always are.
        resolve: host, port → addresses (`resolve_host`; a test's stub).
    """

    lan: bool = False
    resolve: Callable[[str, int], list[str]] = field(default=resolve_host, compare=False)

    def check(self, host: str, port: int) -> list[str]:
        """The addresses to connect to for `host`: all of them allowed, or none.

        Raises:
            PullRefused: one of its addresses is not allowed (a name that also points inside is refused whole).
            OSError: the name does not resolve.
        """
        addrs = self.resolve(host, port)
        if not addrs:
            raise OSError(f"{host} resolves to no address")
        own = own_addresses()
        allowed = {Kind.PUBLIC, Kind.LAN} if self.lan else {Kind.PUBLIC}
        for a in addrs:
            try:
                k = kind(ipaddress.ip_address(a.split("%")[0]), own)
            except ValueError:
                raise PullRefused(f"{host}: {a!r} is not an address") from None
            if k not in allowed:
                raise PullRefused(f"{host}:{port} is {a}: {k.value}")
        return addrs

    def opener(self, *handlers) -> urllib.request.OpenerDirector:
        """An opener that connects through the check only: http and https, redirects (`handlers` may hold a
        redirect handler of its own), no proxy, no ftp or file."""
        if not any(isinstance(h, urllib.request.HTTPRedirectHandler) for h in handlers):
            handlers += (urllib.request.HTTPRedirectHandler(),)
        opener = urllib.request.OpenerDirector()
        for h in (
            _CheckedHTTPHandler(self),
            _CheckedHTTPSHandler(self),
            urllib.request.HTTPDefaultErrorHandler(),
            urllib.request.HTTPErrorProcessor(),
            urllib.request.UnknownHandler(),
            *handlers,
        ):
            opener.add_handler(h)
        return opener


def _checked(policy: PullPolicy, host: str):
    """A `socket.create_connection` stand-in that connects to `host`'s checked addresses only."""

    def create_connection(address, timeout, source_address=None):
        _, port = address
        err: OSError | None = None
        for ip in policy.check(host, port):
            try:
                return socket.create_connection((ip, port), timeout, source_address)  # an address: no lookup
            except OSError as e:
                err = e
        raise err

    return create_connection


class _CheckedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args, policy: PullPolicy, **kw):
        super().__init__(*args, **kw)
        self._create_connection = _checked(policy, self.host)


class _CheckedHTTPSConnection(http.client.HTTPSConnection):
    """TLS on a checked address; the certificate is verified against the URL's host name (SNI too)."""

    def __init__(self, *args, policy: PullPolicy, **kw):
        super().__init__(*args, **kw)
        self._create_connection = _checked(policy, self.host)


class _CheckedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, policy: PullPolicy):
        super().__init__()
        self.policy = policy

    def http_open(self, req):
        return self.do_open(lambda *a, **kw: _CheckedHTTPConnection(*a, policy=self.policy, **kw), req)


class _CheckedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, policy: PullPolicy):
        super().__init__()
        self.policy = policy
        self.context = ssl.create_default_context()  # verifies the certificate and the host name

    def https_open(self, req):
        return self.do_open(
            lambda *a, **kw: _CheckedHTTPSConnection(*a, policy=self.policy, **kw), req, context=self.context
        )
