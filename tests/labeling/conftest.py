import io

import pytest


@pytest.fixture
def csv_bytes():
    def make(rows: list[list[str]], encoding: str = "utf-8", delimiter: str = ",") -> bytes:
        import csv

        buf = io.StringIO()
        csv.writer(buf, delimiter=delimiter, lineterminator="\n").writerows(rows)
        return buf.getvalue().encode(encoding)

    return make


@pytest.fixture(autouse=True)
def english():
    """Messages are asserted in English; the console's default language is Chinese."""
    from django.utils import translation

    with translation.override("en"):
        yield
