"""Attacks as an insider would make them: each test performs one through the real components
and asserts that it fails and leaks nothing (docs/security.md lists each promise and its test)."""

import pytest


@pytest.fixture(autouse=True)
def _english(english):
    """Messages are asserted in English here (tests/conftest.py's `english`)."""
