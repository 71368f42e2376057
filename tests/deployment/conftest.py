import pytest


@pytest.fixture(autouse=True)
def english():
    """Messages are asserted in English; the console's default language is Chinese."""
    from django.utils import translation

    with translation.override("en"):
        yield
