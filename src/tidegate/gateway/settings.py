"""Settings of one gateway process: where it listens and what it accepts.

They come from keyword arguments (the `tidegate gateway` flags) over `TIDEGATE_GATEWAY_*`
environment variables over the defaults below.
"""

from __future__ import annotations

import ipaddress

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

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


class GatewaySettings(BaseSettings):
    """How a gateway listens and what it accepts.

    `allow_unauthenticated_local`: while the gateway is bound to a loopback address and the
    tenant store holds no tenant and no key, requests are served as the built-in local tenant
    without an API key (embedded mode). Creating any tenant or key, or binding anything but
    loopback, makes a valid key mandatory.
    """

    model_config = SettingsConfigDict(env_prefix="TIDEGATE_GATEWAY_", extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    # How long a synchronous call (chat, embeddings) waits for its job before answering 504 with
    # the job id; a client may ask for another wait with X-Tidegate-Timeout, up to the maximum.
    request_timeout_s: float = Field(60.0, gt=0)
    max_request_timeout_s: float = Field(600.0, gt=0)
    # The longest long-poll of GET /v1/jobs/{id}?wait=
    max_wait_s: float = Field(60.0, gt=0)
    # Larger request bodies are refused with 413 before they are read in full. None: what the
    # queue takes as one job (its max_payload_bytes) plus BODY_ENVELOPE_BYTES for the request's
    # own fields; a value above that is lowered to it (see GatewayState.max_body_bytes), so no
    # body is read and parsed only for the queue to refuse it.
    max_body_bytes: int | None = Field(None, gt=0)
    max_messages: int = Field(1_000, gt=0)  # messages in one chat request
    max_batch: int = Field(1_000, gt=0)  # jobs in one POST /v1/jobs
    allow_unauthenticated_local: bool = True
    # How many recent results feed the p50/p99 figures of GET /v1/stats.
    stats_window: int = Field(2_000, gt=0)
    readiness_timeout_s: float = Field(2.0, gt=0)
