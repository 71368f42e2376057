import pytest


@pytest.fixture(autouse=True)
def _english(english):
    """Messages are asserted in English here (tests/conftest.py's `english`)."""
