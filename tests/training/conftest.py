import pytest

from tests.helpers.data import version_for


@pytest.fixture
def make_dataset(team, owner):
    from labeling.datasets import dataset_create

    def make(kind: str = "text_classification", n: int = 80, name: str = ""):
        dataset = dataset_create(actor=owner, team=team, name=name or f"{kind}-{n}", task_kind=kind)
        return version_for(dataset, owner, n)

    return make


@pytest.fixture(autouse=True)
def _english(english):
    """Messages are asserted in English here (tests/conftest.py's `english`)."""


@pytest.fixture
def client(client):
    client.defaults["HTTP_ACCEPT_LANGUAGE"] = "en"
    return client
