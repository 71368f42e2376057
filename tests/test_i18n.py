import os
import shutil
import subprocess
import sys

import pytest
from babel.messages.pofile import read_po
from django.urls import reverse

from tests.helpers.system import ROOT

CATALOG = ROOT / "locale" / "zh_Hans" / "LC_MESSAGES" / "django.po"


def msgids(path) -> set[str]:
    with open(path, "rb") as f:
        return {m.id if isinstance(m.id, str) else m.id[0] for m in read_po(f) if m.id}


def test_every_message_has_a_chinese_translation():
    with open(CATALOG, "rb") as f:
        catalog = read_po(f)
    untranslated = [
        m.id
        for m in catalog
        if m.id and not all((m.string,) if isinstance(m.string, str) else m.string)
    ]
    fuzzy = [m.id for m in catalog if m.id and m.fuzzy]
    assert untranslated == [] and fuzzy == []


def test_the_catalog_holds_every_string_of_the_sources(tmp_path):
    """Extract the strings anew (Django's makemessages, GNU gettext) and compare."""
    if shutil.which("xgettext") is None:
        if os.environ.get("CI"):
            pytest.fail("GNU gettext (xgettext) is missing in CI")
        pytest.skip("GNU gettext (xgettext) is not installed: cannot re-extract the strings")
    # platform/ holds the hardware profiles that the Celery app reads at import.
    names = ("console", "labeling", "training", "deployment", "platform", "locale", "manage.py")
    for name in names:
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    env = {"PATH": "/usr/bin:/bin", "DEBUG": "1", "DJANGO_SETTINGS_MODULE": "console.settings"}
    subprocess.run(
        [sys.executable, "manage.py", "makemessages", "--locale", "zh_Hans", "--no-obsolete"],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    fresh = msgids(tmp_path / "locale" / "zh_Hans" / "LC_MESSAGES" / "django.po")
    assert fresh - msgids(CATALOG) == set(), "run `make messages` and translate the new strings"


def test_console_is_chinese_by_default_and_english_on_request(client, owner, team):
    client.force_login(owner)
    url = reverse("console:dashboard", kwargs={"team": team.slug})
    chinese = client.get(url).content.decode()
    assert "概览" in chinese and "平台健康状态" in chinese and 'lang="zh-hans"' in chinese
    client.post(reverse("set_language"), {"language": "en", "next": url})
    english = client.get(url).content.decode()
    assert "Dashboard" in english and "Platform health" in english and 'lang="en"' in english
