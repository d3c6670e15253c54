"""Where a webhook may point: user input that Gantry's workers connect to."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest

from notifications.addresses import (
    AddressRefused,
    address_refusal,
    checked_address,
    target_of,
    webhook_url_check,
)

REFUSED = [
    "127.0.0.1",
    "127.8.9.10",
    "::1",
    "10.1.2.3",
    "172.16.0.9",
    "192.168.1.1",
    "169.254.169.254",  # cloud metadata
    "fe80::1",
    "fd00:ec2::254",  # AWS metadata over IPv6
    "100.100.100.200",  # Alibaba metadata, shared address space
    "0.0.0.0",
    "224.0.0.1",
    "ff02::1",
    "240.0.0.1",
    "::ffff:127.0.0.1",  # IPv4-mapped loopback
    "::ffff:10.0.0.1",
    "2002:a00:1::",  # 6to4 carrying 10.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 carrying 169.254.169.254
    "192.0.2.10",  # documentation
]


@pytest.mark.parametrize("address", REFUSED)
def test_non_public_addresses_are_refused(address: str, settings: Any) -> None:
    settings.WEBHOOK_ALLOW = []
    reason = address_refusal(ipaddress.ip_address(address))
    assert reason, address
    with pytest.raises(AddressRefused, match="GANTRY_WEBHOOK_ALLOW"):
        webhook_url_check(f"http://[{address}]/hook" if ":" in address else f"http://{address}/")


@pytest.mark.parametrize("address", ["93.184.215.14", "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses_pass(address: str, settings: Any) -> None:
    settings.WEBHOOK_ALLOW = []
    assert address_refusal(ipaddress.ip_address(address)) is None
    url = f"https://[{address}]:8443/hook?x=1" if ":" in address else f"https://{address}/h"
    assert webhook_url_check(url).host == address.strip("[]")


def test_an_operator_allow_list_opens_a_network(settings: Any) -> None:
    settings.WEBHOOK_ALLOW = [ipaddress.ip_network("127.0.0.1/32")]
    assert address_refusal(ipaddress.ip_address("127.0.0.1")) is None
    assert address_refusal(ipaddress.ip_address("::ffff:127.0.0.1")) is None
    assert address_refusal(ipaddress.ip_address("127.0.0.2")) is not None
    assert address_refusal(ipaddress.ip_address("10.0.0.1")) is not None


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://93.184.215.14/x", "only http"),
        ("file:///etc/passwd", "only http"),
        ("gopher://93.184.215.14/", "only http"),
        ("http://user:pw@93.184.215.14/", "no user name or password"),
        ("http:///nohost", "names no host"),
        ("http://93.184.215.14:99999/", "not a valid URL"),
        ("http://93.184.215.14/a b", "no spaces"),
        ("http://93.184.215.14/\nHost: evil", "no spaces or control characters"),
    ],
)
def test_bad_urls_say_why(url: str, why: str) -> None:
    with pytest.raises(AddressRefused, match=why):
        target_of(url)


def test_target_parts() -> None:
    target = target_of("https://hooks.example.org/gantry/in?team=a")
    assert (target.scheme, target.host, target.port, target.path) == (
        "https",
        "hooks.example.org",
        443,
        "/gantry/in?team=a",
    )
    assert target_of("http://93.184.215.14").path == "/"
    assert target_of("http://93.184.215.14").port == 80


def test_a_name_resolving_to_any_refused_address_is_refused_whole(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.WEBHOOK_ALLOW = []

    def resolver(host: str, port: int, **kwargs: Any) -> list[Any]:
        assert host == "mixed.example.org"
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", port)),
        ]

    monkeypatch.setattr("notifications.addresses.socket.getaddrinfo", resolver)
    with pytest.raises(AddressRefused, match=r"10\.0\.0\.7 is a private address"):
        checked_address(target_of("https://mixed.example.org/"))


def test_localhost_by_name_is_loopback(settings: Any) -> None:
    settings.WEBHOOK_ALLOW = []
    with pytest.raises(AddressRefused, match="loopback"):
        webhook_url_check("http://localhost:8080/hook")


def test_a_name_that_does_not_resolve_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def resolver(*args: Any, **kwargs: Any) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr("notifications.addresses.socket.getaddrinfo", resolver)
    with pytest.raises(AddressRefused, match="does not resolve"):
        webhook_url_check("https://nowhere.invalid/")
