import pytest

from tests.helpers.data import csv_data


@pytest.fixture
def csv_bytes():
    """tests.helpers.data.csv_data: ``rows`` as the bytes of a CSV file."""
    return csv_data


@pytest.fixture(autouse=True)
def _english(english):
    """Messages are asserted in English here (tests/conftest.py's `english`)."""
