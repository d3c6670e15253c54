"""Where a webhook may point: user input that Gantry's workers will connect to.

Refused unless an operator allowed them (``GANTRY_WEBHOOK_ALLOW``, CIDR networks):
loopback, private, link-local (cloud metadata at 169.254.169.254 among them), shared
(100.64/10), multicast, reserved, unspecified and every other non-global address, and IPv6
forms that carry such an IPv4 address (mapped, 6to4, NAT64). Only ``http`` and ``https``,
no user name or password in the URL.

The URL is checked when a subscription is created (the host must resolve, and every
address it resolves to must be allowed) and again before every send, after resolving
again: the connection then goes to the address that passed the check, never to a second
resolution, so a name that answers differently the second time (DNS rebinding) gains
nothing.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class AddressRefused(Exception):
    """A webhook URL or the address it resolves to is not allowed; says why."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    # The path and query to request.
    path: str


def _embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _operator_allowed(ip: IPAddress) -> bool:
    return any(
        ip.version == network.version and ip in network for network in settings.WEBHOOK_ALLOW
    )


def address_refusal(ip: IPAddress) -> str | None:
    """Why Gantry will not send to ``ip``, or None when it may."""
    if _operator_allowed(ip):
        return None
    embedded = _embedded_ipv4(ip)
    if embedded is not None:
        if _operator_allowed(embedded):
            return None
        reason = address_refusal(embedded)
        return f"{ip} carries {embedded}: {reason}" if reason else None
    if ip.is_loopback:
        return f"{ip} is a loopback address"
    if ip.is_link_local:
        return f"{ip} is link-local (cloud metadata services live there)"
    if ip.is_multicast:
        return f"{ip} is a multicast address"
    if ip.is_private:
        return f"{ip} is a private address"
    if ip.is_unspecified or ip.is_reserved or not ip.is_global:
        return f"{ip} is not a public address"
    return None


def target_of(url: str) -> Target:
    """The parts of a webhook URL, or AddressRefused naming what is wrong with it."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as error:
        raise AddressRefused(f"not a valid URL ({error})") from None
    if parts.scheme not in ("http", "https"):
        raise AddressRefused("only http:// and https:// URLs")
    if parts.username is not None or parts.password is not None:
        raise AddressRefused("no user name or password in the URL (they would be logged)")
    host = parts.hostname or ""
    if not host:
        raise AddressRefused("the URL names no host")
    if any(ord(character) < 33 for character in url):
        raise AddressRefused("no spaces or control characters in the URL")
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    default_port = 443 if parts.scheme == "https" else 80
    return Target(scheme=parts.scheme, host=host, port=port or default_port, path=path)


def resolve(target: Target) -> list[IPAddress]:
    """Every address the host resolves to (an IP literal: itself)."""
    try:
        return [ipaddress.ip_address(target.host)]
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as error:
        raise AddressRefused(f"{target.host} does not resolve ({error})") from None
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in found:
        ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if ip not in addresses:
            addresses.append(ip)
    if not addresses:
        raise AddressRefused(f"{target.host} resolves to no address")
    return addresses


def checked_address(target: Target) -> IPAddress:
    """Resolve the target and return the address to connect to; AddressRefused when any
    address it resolves to is refused (fail closed: a name that mixes a public and a
    private address is refused whole)."""
    addresses = resolve(target)
    for ip in addresses:
        reason = address_refusal(ip)
        if reason:
            raise AddressRefused(
                f"{target.host}: {reason}; an operator may allow it with GANTRY_WEBHOOK_ALLOW"
            )
    return addresses[0]


def webhook_url_check(url: str) -> Target:
    """The check at subscription time: a valid URL whose host resolves only to allowed
    addresses."""
    target = target_of(url)
    checked_address(target)
    return target
