"""The client's address: what limits per address count (login throttling, request rates).

The TCP peer (``REMOTE_ADDR``; Daphne runs without ``--proxy-headers``) is the client,
unless the peer is a proxy trusted by configuration (``DJANGO_TRUSTED_PROXIES``: its
addresses or networks). Only then is ``X-Forwarded-For`` read, from the right: the
entry the trusted proxy wrote is the address it saw; entries to its left came from the
client and are believed only as far as each was written by another trusted proxy.
Daphne's own ``--proxy-headers`` takes the first entry, which the client chooses, and
believes it from any peer: that is why the header is read here and not there.

An address is counted by :func:`bucket`: IPv4 as is (an IPv4-mapped IPv6 address as its
IPv4 address), IPv6 by its /64, the block one subscriber is given, so a client cannot
take a fresh budget with every address of its own network.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

from django.conf import settings

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
IPV6_BUCKET_PREFIX = 64


def parse_networks(items: Iterable[str]) -> tuple[Network, ...]:
    """``DJANGO_TRUSTED_PROXIES``'s entries as networks (an address is its own /32 or
    /128); ValueError naming an entry that is neither."""
    networks = []
    for item in items:
        try:
            networks.append(ipaddress.ip_network(item.strip(), strict=False))
        except ValueError:
            raise ValueError(
                f"DJANGO_TRUSTED_PROXIES: {item!r} is not an IP address or network") from None
    return tuple(networks)


@lru_cache(maxsize=8)
def _trusted(items: tuple[str, ...]) -> tuple[Network, ...]:
    return parse_networks(items)


def _address(text: Any) -> Address | None:
    if not isinstance(text, str):
        return None
    text = text.strip()
    if text.startswith("[") and "]" in text:  # "[2001:db8::1]:443"
        text = text[1:text.index("]")]
    elif text.count(":") == 1:  # "192.0.2.1:443"
        text = text.partition(":")[0]
    try:
        address = ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _is_trusted(address: Address, trusted: tuple[Network, ...]) -> bool:
    return any(address.version == net.version and address in net for net in trusted)


def client_address(meta: Mapping[str, Any]) -> Address | None:
    """The client's address for a request's ``META`` (or a WSGI-like mapping); None
    when the peer is unknown."""
    peer = _address(meta.get("REMOTE_ADDR"))
    trusted = _trusted(tuple(settings.TRUSTED_PROXIES))
    if peer is None or not _is_trusted(peer, trusted):
        return peer
    hops = str(meta.get("HTTP_X_FORWARDED_FOR") or "").split(",")
    client = peer
    for hop in reversed(hops):
        if not _is_trusted(client, trusted):
            break
        told = _address(hop)
        if told is None:
            break  # a garbled entry: the last proxy that wrote a good one is the client
        client = told
    return client


def bucket(address: Address | None) -> str | None:
    """What a limit per address counts ``address`` as (see the module's docstring)."""
    if address is None:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        net = ipaddress.IPv6Network((address, IPV6_BUCKET_PREFIX), strict=False)
        return str(net)
    return str(address)


def client_bucket(meta: Mapping[str, Any]) -> str | None:
    """:func:`bucket` of :func:`client_address`."""
    return bucket(client_address(meta))
