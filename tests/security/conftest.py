"""Attacks as an insider would make them: each test performs one through the real components
and asserts that it fails and leaks nothing (docs/security.md lists each promise and its test)."""

import pytest
from django.utils import translation


@pytest.fixture(autouse=True)
def english():
    """Messages are asserted in English; the platform's default language is zh-hans."""
    with translation.override("en"):
        yield
