import stat

from django.contrib.auth import get_user_model
from django.core.management import call_command

from console.models import AuditEvent, Membership


def run_bootstrap(capsys) -> str:
    call_command("platform_bootstrap", url="http://127.0.0.1:8000/")
    return capsys.readouterr().out


def test_first_run_creates_admin_and_team_and_prints_the_login(
    db, settings, tmp_path, capsys, monkeypatch
):
    settings.DATA_DIR = tmp_path
    monkeypatch.delenv("PLATFORM_ADMIN_PASSWORD", raising=False)
    out = run_bootstrap(capsys)
    password = (tmp_path / "initial_admin_password").read_text().strip()
    assert stat.S_IMODE((tmp_path / "initial_admin_password").stat().st_mode) == 0o600
    assert "http://127.0.0.1:8000/" in out and f"admin / {password}" in out
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser and admin.check_password(password)
    assert Membership.objects.get(user=admin).role == "owner"
    # The second run changes nothing and says where the password is, not what it is.
    again = run_bootstrap(capsys)
    assert "admin / " in again and password not in again and "initial_admin_password" in again
    assert get_user_model().objects.count() == 1
    assert AuditEvent.objects.filter(action="user.create").count() == 1


def test_admin_from_environment(db, settings, tmp_path, capsys, monkeypatch):
    settings.DATA_DIR = tmp_path
    monkeypatch.setenv("PLATFORM_ADMIN_USERNAME", "ops")
    monkeypatch.setenv("PLATFORM_ADMIN_PASSWORD", "Chosen-Password-1")
    out = run_bootstrap(capsys)
    # The password came from the environment: its owner knows it, the log need not.
    assert "ops / (PLATFORM_ADMIN_PASSWORD)" in out and "Chosen-Password-1" not in out
    assert get_user_model().objects.get(username="ops").check_password("Chosen-Password-1")
    assert not (tmp_path / "initial_admin_password").exists()
