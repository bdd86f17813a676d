"""Shared pytest setup: root-only tests skip with a clear message elsewhere."""

from __future__ import annotations

import os

import pytest

IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(
    not IS_ROOT, reason="needs root: builds network namespaces (CI runs as root)"
)
