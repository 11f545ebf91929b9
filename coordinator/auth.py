"""Bearer tokens: one operator token for ``/v1`` and one token per job for its workers.

Tokens are compared with :func:`hmac.compare_digest` so response timing does not leak how
much of a guess was right. The per-job token lets a worker report on its own job and on
nothing else; the operator token is never handed to workers.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets


class InsecureBindError(RuntimeError):
    """Raised when asked to listen on a non-loopback address without an operator token."""


def new_job_token() -> str:
    return secrets.token_urlsafe(32)


def token_matches(presented: str | None, expected: str | None) -> bool:
    """True when ``presented`` equals ``expected``; an unset ``expected`` matches nothing."""
    if not presented or not expected:
        return False
    return hmac.compare_digest(presented.encode(), expected.encode())


def bearer_from_header(value: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve beyond loopback without a token: anyone on the network could otherwise
    submit jobs that run code paths on the cluster."""
    if not is_loopback(host) and not token:
        raise InsecureBindError(
            f"refusing to listen on {host!r} without a token: set GRADWIRE_TOKEN "
            "or listen on 127.0.0.1"
        )
