"""Settings of one gateway process: where it listens and what it accepts.

`GatewaySettings` is the `[gateway]` section of the configuration (tidegate.config): the
`tidegate gateway` flags over `TIDEGATE_GATEWAY__*` or `TIDEGATE_GATEWAY_*` environment
variables over `tidegate.toml` over the defaults.
"""

from __future__ import annotations

import ipaddress

from tidegate.config import GatewaySettings

__all__ = ["BODY_ENVELOPE_BYTES", "GatewaySettings", "is_loopback_host"]

MIB = 1024 * 1024
# What a request body may hold beyond its job's payload: the priority, callback URL and
# timeout of a job, the JSON around them and the client's whitespace.
BODY_ENVELOPE_BYTES = 64 * 1024


def is_loopback_host(host: str) -> bool:
    """Whether binding `host` serves this machine only ("localhost" or a loopback address).
    An empty host or a wildcard (0.0.0.0, ::) binds every interface, so it is not loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere
