"""runtime/env.py: typed reads of the environment, refused with the variable and the value."""

from pathlib import Path

import pytest

from runtime.env import EnvError, env_bool, env_float, env_int, env_list, env_path, env_str


def test_unset_or_blank_takes_the_default(monkeypatch):
    monkeypatch.delenv("X_UNSET", raising=False)
    monkeypatch.setenv("X_BLANK", "  ")
    for name in ("X_UNSET", "X_BLANK"):
        assert env_str(name, "d") == "d"
        assert env_int(name, 3) == 3
        assert env_float(name, 1.5) == 1.5
        assert env_bool(name, True) is True
        assert env_path(name, "/srv/data") == Path("/srv/data")


def test_values_are_read_as_their_type(monkeypatch):
    monkeypatch.setenv("X_INT", " 42 ")
    monkeypatch.setenv("X_FLOAT", "0.25")
    monkeypatch.setenv("X_LIST", "a, b,,c ")
    monkeypatch.setenv("X_SECRET", " keeps its blanks ")
    assert env_int("X_INT", 0, min=1, max=42) == 42
    assert env_float("X_FLOAT", 0.0, max=1) == 0.25
    assert env_list("X_LIST") == ["a", "b", "c"]
    assert env_str("X_SECRET") == " keeps its blanks "
    for word, value in [("1", True), ("Yes", True), ("on", True), ("0", False), ("OFF", False)]:
        monkeypatch.setenv("X_BOOL", word)
        assert env_bool("X_BOOL", not value) is value


def test_an_empty_list_and_an_empty_integer_of_its_own(monkeypatch):
    monkeypatch.setenv("X_EMPTY", "")
    assert env_list("X_EMPTY", "a,b") == []
    assert env_int("X_EMPTY", 200000, empty=0) == 0
    monkeypatch.delenv("X_EMPTY")
    assert env_list("X_EMPTY", "a,b") == ["a", "b"]
    assert env_int("X_EMPTY", 200000, empty=0) == 200000


@pytest.mark.parametrize(
    ("value", "read", "refusal"),
    [
        ("ten", lambda: env_int("X_BAD", 1), "X_BAD='ten': not an integer"),
        ("1.5", lambda: env_int("X_BAD", 1), "X_BAD='1.5': not an integer"),
        ("maybe", lambda: env_bool("X_BAD", False), "X_BAD='maybe': not a boolean"),
        ("fast", lambda: env_float("X_BAD", 1.0), "X_BAD='fast': not a number"),
        ("nan", lambda: env_float("X_BAD", 1.0), "X_BAD='nan': not a finite number"),
        ("0", lambda: env_int("X_BAD", 1, min=1), "X_BAD='0': must be at least 1"),
        ("9", lambda: env_float("X_BAD", 1.0, max=8), "X_BAD='9': must be at most 8"),
    ],
)
def test_a_bad_value_names_the_variable_and_the_value(monkeypatch, value, read, refusal):
    monkeypatch.setenv("X_BAD", value)
    with pytest.raises(EnvError) as refused:
        read()
    assert str(refused.value).startswith(refusal)


def test_a_required_variable(monkeypatch):
    monkeypatch.delenv("X_REQUIRED", raising=False)
    with pytest.raises(EnvError, match="X_REQUIRED is not set"):
        env_str("X_REQUIRED", required=True)
