"""The outbound HTTP of webhooks, and the SSRF guard in front of it.

A webhook URL is the tenant's input, and the broker POSTs to it from inside the platform's network. So:
- only ``https://`` (``http://`` only with ``WEBHOOK_ALLOW_LOOPBACK``, development and tests);
- the host must resolve, and every address it resolves to must be global: private, loopback, link-local
  (cloud metadata at 169.254.169.254), shared, reserved, multicast and unspecified addresses are refused
  (loopback alone is let through with ``WEBHOOK_ALLOW_LOOPBACK``), and so is every IPv6 spelling of such an
  IPv4 address (``[::ffff:127.0.0.1]``, ``[::169.254.169.254]``, NAT64 ``[64:ff9b::a9fe:a9fe]``, 6to4
  ``[2002:7f00:1::1]``, IPv4-translated) and every non-global IPv6 (site-local ``fec0::/10``, unique local,
  link-local, documentation, Teredo, …);
- the check runs when the endpoint is saved *and* before every send, and the connection goes to the very
  address that was checked (pinned; the Host header and TLS name stay the URL's), so DNS that answers a
  public address at the check and a private one at the connect (rebinding) reaches nothing inside;
- redirects are never followed, and every POST ends by its deadline (the whole exchange, not each socket
  read: ``post``), reading at most a bounded part of the answer.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import urllib3
import urllib3.connection
from django.conf import settings

from core.errors import ApplicationError


class UnsafeUrl(ApplicationError):
    status = 422
    code = "unsafe_url"
    title = "Webhook URL refused"


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str
    address: str  # the checked IP the connection goes to


# IPv6 that reaches an IPv4 host through a translator: the IPv4 in the low 32 bits decides (RFC 6052)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
# IPv6 that is not globally reachable (IANA special-purpose registry) and that Python's ``is_global`` /
# ``is_reserved`` / ``is_site_local`` do not all know in every supported version: IPv4-compatible ``::a.b.c.d``
# (deprecated), IPv4-translated ``::ffff:0:a.b.c.d``, the local-use NAT64 prefix, documentation (RFC 9637),
# SRv6 SIDs, site-local.
_NOT_GLOBAL_V6 = tuple(ipaddress.IPv6Network(network) for network in (
    "::/96", "::ffff:0:0:0/96", "64:ff9b:1::/48", "3fff::/20", "5f00::/16", "fec0::/10"))


def _address_allowed(address: ipaddress.IPv4Address | ipaddress.IPv6Address, allow_loopback: bool) -> bool:
    """Whether a POST may go to ``address``: a global unicast address, and for an IPv6 form that carries an
    IPv4 address (mapped, NAT64, 6to4) that IPv4 address is global too. Loopback only with ``allow_loopback``,
    and then only as itself (``127.0.0.1``, ``::1``, ``::ffff:127.0.0.1``), never wrapped in a translation."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:  # ::ffff:a.b.c.d is the socket address of a.b.c.d
            address = address.ipv4_mapped
        elif address in _NAT64:
            return _address_allowed(ipaddress.IPv4Address(address.packed[-4:]), allow_loopback=False)
        elif address.sixtofour is not None and not _address_allowed(address.sixtofour, allow_loopback=False):
            return False
    if address.is_loopback:
        return allow_loopback
    if isinstance(address, ipaddress.IPv6Address) and (
            address.is_reserved or address.is_site_local or any(address in net for net in _NOT_GLOBAL_V6)):
        return False
    return address.is_global and not address.is_multicast


def url_check(url: str, *, resolve: bool = True) -> Target:
    """The target of ``url`` if it is safe to POST to, else ``UnsafeUrl`` naming ``url``."""
    allow_loopback = settings.WEBHOOK_ALLOW_LOOPBACK
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise UnsafeUrl("url is not a valid URL.", field="url") from None
    schemes = ("https", "http") if allow_loopback else ("https",)
    if parts.scheme not in schemes:
        raise UnsafeUrl("url must start with https://.", field="url")
    if not parts.hostname or parts.username is not None or parts.password is not None:
        raise UnsafeUrl("url must name a host and carry no user name or password.", field="url")
    if parts.fragment:
        raise UnsafeUrl("url must not have a #fragment.", field="url")
    host = parts.hostname
    port = port or (443 if parts.scheme == "https" else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        addresses = [literal]
    elif not resolve:
        return Target(parts.scheme, host, port, path, "")
    else:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            raise UnsafeUrl(f"url: the host '{host}' does not resolve.", field="url") from None
        addresses = [ipaddress.ip_address(info[4][0].split("%", 1)[0]) for info in infos]
    if not addresses:
        raise UnsafeUrl(f"url: the host '{host}' does not resolve.", field="url")
    refused = [str(a) for a in addresses if not _address_allowed(a, allow_loopback)]
    if refused:
        raise UnsafeUrl(f"url resolves to an address that is not public ({', '.join(refused)}); webhooks are "
                        f"sent only to public addresses.", field="url")
    return Target(parts.scheme, host, port, path, str(addresses[0]))


@dataclass(frozen=True)
class Response:
    status: int | None  # None: no answer (timeout, refused, TLS error)
    error: str = ""


def post(url: str, body: bytes, headers: dict[str, str], *, timeout_seconds: float,
         max_response_bytes: int = 64 * 1024) -> Response:
    """POST ``body`` to ``url`` through the guard (``UnsafeUrl`` if it resolves somewhere refused).

    ``timeout_seconds`` is a deadline for the whole exchange, not a per-socket timeout: connecting, the TLS
    handshake, sending, the status line and headers and the part of the body read all end by then. Each socket
    operation waits at most the time left, and a watchdog thread shuts the socket down at the deadline, which
    ends a read in progress; so a receiver that drips one byte at a time (each read returns before a per-socket
    timeout would fire) holds the sender no longer than the deadline. At most ``max_response_bytes`` of the body
    are read; the status decides the outcome. Resolving the name (``url_check``) comes before the deadline
    starts and is bounded by the system resolver."""
    target = url_check(url)
    deadline = time.monotonic() + timeout_seconds
    host_header = target.host if ":" not in target.host else f"[{target.host}]"
    default_port = 443 if target.scheme == "https" else 80
    if target.port != default_port:
        host_header += f":{target.port}"

    def left() -> float:
        return max(0.001, deadline - time.monotonic())

    if target.scheme == "https":
        connection = urllib3.connection.HTTPSConnection(
            target.address, target.port, timeout=left(), server_hostname=target.host, assert_hostname=target.host,
            cert_reqs="CERT_REQUIRED")
    else:
        connection = urllib3.connection.HTTPConnection(target.address, target.port, timeout=left())
    expired = threading.Event()

    def hang_up() -> None:
        expired.set()
        sock = connection.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    watchdog = threading.Timer(left(), hang_up)
    watchdog.daemon = True
    watchdog.start()
    status = None
    try:
        connection.request("POST", target.path, body=body, headers={**headers, "Host": host_header},
                           preload_content=False)
        response = connection.getresponse()
        status = response.status
        read = 0
        while read < max_response_bytes and not expired.is_set():  # a bounded look at the answer, then hang up
            chunk = response.read(min(8192, max_response_bytes - read), decode_content=False)
            if not chunk:
                break
            read += len(chunk)
        return Response(status)
    except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError) as error:
        if status is not None:
            return Response(status)  # answered; only the rest of its body was cut off
        if expired.is_set():
            return Response(None, f"deadline: no answer within {timeout_seconds:g} s (WEBHOOK_TIMEOUT_SECONDS, the "
                                  f"whole delivery's time); hung up")
        return Response(None, f"{type(error).__name__}: {error}"[:300])
    finally:
        watchdog.cancel()
        connection.close()
