"""Bearer tokens and other secrets: from a file when one is named, else from the environment.

A file wins over the environment so that a unit file or a Kubernetes secret mount can override
what a shell happened to export. A file's content is stripped (files end with a newline); an
empty secret is no secret (``None``), so "no token" has one spelling everywhere.
"""

from __future__ import annotations

import os
from pathlib import Path

# The environment variables of the collector's two tokens (agents and the simulator send the
# ingest token; readers such as the audit send the read token).
INGEST_TOKEN_ENV = "FLEETLENS_INGEST_TOKEN"
READ_TOKEN_ENV = "FLEETLENS_READ_TOKEN"
TOKEN_ENVS = (INGEST_TOKEN_ENV, READ_TOKEN_ENV)


def read_secret(env: str, path: Path | None) -> str | None:
    """The secret in ``path`` if given (an unreadable file raises ``OSError``), else ``$env``."""
    if path is not None:
        return path.read_text().strip() or None
    return os.environ.get(env) or None
