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
