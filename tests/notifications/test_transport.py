"""The webhook SSRF guard (``notifications.transport.url_check``) over the many spellings of an address: every
IPv6 form that carries a non-global IPv4 (IPv4-mapped, IPv4-compatible, NAT64, 6to4, IPv4-translated) and every
non-global IPv6 is refused, in production and with ``WEBHOOK_ALLOW_LOOPBACK`` alike; public addresses pass
(issue 27, item 5)."""

from __future__ import annotations

import ipaddress

import pytest

from notifications.transport import UnsafeUrl, url_check

REFUSED = {
    # IPv4-compatible ::a.b.c.d (deprecated, RFC 4291 §2.5.5.1)
    "[::127.0.0.1]": "loopback in IPv4-compatible",
    "[::169.254.169.254]": "cloud metadata in IPv4-compatible",
    "[::10.0.0.1]": "private in IPv4-compatible",
    "[::8.8.8.8]": "IPv4-compatible is deprecated whatever it carries",
    # IPv4-mapped ::ffff:a.b.c.d
    "[::ffff:127.0.0.1]": "loopback, mapped",
    "[::ffff:169.254.169.254]": "metadata, mapped",
    "[::ffff:a9fe:a9fe]": "metadata, mapped, in hex",
    # IPv4-translated ::ffff:0:a.b.c.d (RFC 2765)
    "[::ffff:0:127.0.0.1]": "loopback, translated",
    "[::ffff:0:a9fe:a9fe]": "metadata, translated",
    # NAT64: the well-known prefix 64:ff9b::/96 (RFC 6052) and the local-use 64:ff9b:1::/48 (RFC 8215)
    "[64:ff9b::127.0.0.1]": "loopback through NAT64",
    "[64:ff9b::a9fe:a9fe]": "metadata through NAT64",
    "[64:ff9b::10.1.2.3]": "private through NAT64",
    "[64:ff9b:1::8.8.8.8]": "local-use NAT64 prefix",
    "[64:ff9b:1:ffff::a9fe:a9fe]": "local-use NAT64 prefix",
    # 6to4 2002:AABB:CCDD::/48 carries AA.BB.CC.DD
    "[2002:7f00:1::1]": "loopback in 6to4",
    "[2002:a9fe:a9fe::1]": "metadata in 6to4",
    "[2002:c0a8:1::1]": "private in 6to4",
    # Teredo 2001::/32 (server and obfuscated client in the address)
    "[2001:0:4136:e378:8000:63bf:3fff:fdd2]": "Teredo",
    "[2001:0:7f00:1::1]": "Teredo with a loopback server",
    # IPv6 that is not global
    "[::1]": "loopback",
    "[::]": "unspecified",
    "[fec0::1]": "site-local (deprecated)",
    "[fefe::1]": "site-local, upper end",
    "[fc00::1]": "unique local",
    "[fd12:3456::1]": "unique local",
    "[fe80::1]": "link-local",
    "[febf::1]": "link-local, upper end",
    "[2001:db8::1]": "documentation",
    "[3fff::1]": "documentation (RFC 9637)",
    "[100::1]": "discard-only",
    "[5f00::1]": "SRv6 SIDs",
    "[ff02::1]": "multicast",
    "[ff0e::1]": "global multicast",
    "[2001:10::1]": "ORCHID",
    "[2001:2::1]": "benchmarking",
    # IPv4 that is not global
    "127.0.0.1": "loopback", "169.254.169.254": "metadata", "10.0.0.1": "private", "100.64.0.1": "shared",
    "0.0.0.0": "unspecified", "224.0.0.1": "multicast", "240.0.0.1": "reserved", "192.0.2.1": "documentation",
}
PLAIN_LOOPBACK = ("[::1]", "127.0.0.1", "[::ffff:127.0.0.1]")
ALLOWED = ["93.184.215.14", "8.8.8.8", "[2606:4700:4700::1111]", "[2a00:1450:4001::200e]",
           "[::ffff:8.8.8.8]", "[64:ff9b::8.8.8.8]", "[2002:808:808::1]"]


@pytest.mark.parametrize("host", sorted(REFUSED))
@pytest.mark.parametrize("allow_loopback", [False, True])
def test_url_check_refuses_every_non_global_form(settings, host, allow_loopback):
    settings.WEBHOOK_ALLOW_LOOPBACK = allow_loopback
    if allow_loopback and host in PLAIN_LOOPBACK:  # what WEBHOOK_ALLOW_LOOPBACK lets through, and nothing else
        assert url_check(f"http://{host}/hook").address
        return
    with pytest.raises(UnsafeUrl) as refused:
        url_check(f"https://{host}/hook")
    assert refused.value.field == "url", REFUSED[host]


@pytest.mark.parametrize("host", ALLOWED)
def test_url_check_lets_public_addresses_through(settings, host):
    settings.WEBHOOK_ALLOW_LOOPBACK = False
    assert ipaddress.ip_address(url_check(f"https://{host}/hook").address) == ipaddress.ip_address(host.strip("[]"))
