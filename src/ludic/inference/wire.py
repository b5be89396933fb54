"""Names on the wire between Ludic's vLLM server and its clients (one definition for both sides).

Standard library only: the server imports it without the training stack, clients without vLLM.
"""

from __future__ import annotations

import os

POLICY_ALIAS = "ludic-policy"
"""Model name that a Ludic server resolves to its current policy at admission."""
VERSION_HEADER = "x-ludic-policy-version"
"""Response header: version of the weights a generation request was admitted to."""
MODEL_HEADER = "x-ludic-model"
"""Response header: the served model (or adapter) name the request was resolved to."""
MIXED_HEADER = "x-ludic-policy-mixed"
"""Response header, ``1`` when a full-weight swap cut the request's drain short."""
TOKEN_ENV = "LUDIC_SERVER_TOKEN"
"""Environment variable holding the bearer token (server and clients)."""


def client_token(token: str | None = None) -> str | None:
    """The token a client sends: the one given, else ``$LUDIC_SERVER_TOKEN`` (None: no auth)."""
    return token if token is not None else (os.environ.get(TOKEN_ENV) or None)


def auth_headers(token: str | None) -> dict[str, str]:
    """``Authorization: Bearer <token>`` (empty when there is no token)."""
    return {"Authorization": f"Bearer {token}"} if token else {}
