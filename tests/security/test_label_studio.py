"""Label Studio, tried by an insider: the real Label Studio 1.23.2 that `make test` starts, with
two teams (Alpha and Beta), each in its own organisation.

The accounts are the ones the platform hands over: the console's "open in Label Studio" sets
Label Studio's session cookie of the user's own account; with that session, an account can
also make itself an API token (Label Studio's account page does the same).
"""

import http.server
import logging
import threading
import time
import uuid

import httpx
import pytest
from django.utils import translation

from console.models import Membership
from console.roles import Role
from labeling import consensus, label_studio, label_studio_admin, selectors
from labeling.exports import labeling_project_export
from labeling.imports import import_run
from labeling.models import Annotation, LabelStudioAccount
from labeling.projects import (
    WEBHOOK_SECRET_HEADER,
    labeling_project_webhook_register,
)
from labeling.sync import label_studio_members_converge, labeling_project_sync
from tests.helpers.label_studio import choice, needs_label_studio, reviews_project, task_ids

pytestmark = needs_label_studio

DENIED = (401, 403, 404)


class Browser:
    """A browser holding the Label Studio session the console handed over."""

    def __init__(self, session: str) -> None:
        self.base = label_studio.settings.LABEL_STUDIO_URL
        self.http = httpx.Client(base_url=self.base, cookies={"sessionid": session}, timeout=30)
        self.http.get("/user/login/")  # Label Studio sets its CSRF cookie on a page

    def _headers(self) -> dict:
        return {
            "X-CSRFToken": self.http.cookies.get("csrftoken", ""),
            "Referer": f"{self.base}/projects/",
        }

    def get(self, path: str, **kw) -> httpx.Response:
        return self.http.get(path, **kw)

    def post(self, path: str, **kw) -> httpx.Response:
        return self.http.post(path, headers=self._headers(), **kw)

    def delete(self, path: str) -> httpx.Response:
        return self.http.delete(path, headers=self._headers())

    def patch(self, path: str, **kw) -> httpx.Response:
        return self.http.patch(path, headers=self._headers(), **kw)

    def token(self) -> "TokenClient":
        """An API token of the account's own (Label Studio's "reset token")."""
        made = self.post("/api/current-user/reset-token/")
        assert made.status_code == 201, made.text
        return TokenClient(made.json()["token"])


class TokenClient:
    def __init__(self, key: str) -> None:
        self.http = httpx.Client(
            base_url=label_studio.settings.LABEL_STUDIO_URL,
            headers={"Authorization": f"Token {key}"},
            timeout=30,
        )

    def get(self, path: str, **kw) -> httpx.Response:
        return self.http.get(path, **kw)

    def post(self, path: str, **kw) -> httpx.Response:
        return self.http.post(path, **kw)

    def delete(self, path: str) -> httpx.Response:
        return self.http.delete(path)

    def patch(self, path: str, **kw) -> httpx.Response:
        return self.http.patch(path, **kw)


def project_ids(response: httpx.Response) -> set[int]:
    if response.status_code != 200:
        return set()
    body = response.json()
    items = body["results"] if isinstance(body, dict) else body
    return {p["id"] for p in items}


@pytest.fixture
def teams(make_user, make_team):
    """Alpha and Beta, each with an owner and an annotator, and a pushed labeling project."""
    people = {n: make_user(n) for n in ("olivia", "alice", "carol", "oscar", "bob")}
    alpha = make_team(
        "Alpha",
        {
            people["olivia"]: Role.OWNER,
            people["alice"]: Role.ANNOTATOR,
            people["carol"]: Role.ANNOTATOR,
        },
    )
    beta = make_team("Beta", {people["oscar"]: Role.OWNER, people["bob"]: Role.ANNOTATOR})
    projects = {}
    for team, owner in ((alpha, people["olivia"]), (beta, people["oscar"])):
        dataset_name = f"评论-{uuid.uuid4().hex[:6]}"
        projects[team.slug] = reviews_project(
            team, owner, "标注", dataset_name=dataset_name, overlap=3
        )
    return {"alpha": alpha, "beta": beta, "projects": projects, **people}


def hand_over(client, user, team, project) -> Browser:
    """The console's "open in Label Studio", as ``user``."""
    client.force_login(user)
    response = client.get(f"/t/{team.slug}/labeling/{project.pk}/open/")
    assert response.status_code == 302, response.content[:300]
    return Browser(response.cookies["sessionid"].value)


def assert_no_access(who, project) -> None:
    """``who`` (a session or a token) neither lists nor reaches ``project`` in Label Studio:
    not its page of data, its tasks, its export, its annotations, nor its deletion."""
    ls_id = project.ls_project_id
    task = next(iter(task_ids(project).values()))
    assert ls_id not in project_ids(who.get("/api/projects/", params={"page_size": 1000}))
    assert who.get(f"/api/projects/{ls_id}/").status_code in DENIED
    export = who.get(f"/api/projects/{ls_id}/export", params={"exportType": "JSON"})
    assert export.status_code in DENIED and "房间" not in export.text
    assert who.get(f"/api/tasks/{task}/").status_code in DENIED
    listed = who.get("/api/tasks/", params={"project": ls_id})
    assert listed.status_code in DENIED or not listed.json().get("tasks"), listed.text[:300]
    vote = who.post(f"/api/tasks/{task}/annotations/", json={"result": choice("负面")})
    assert vote.status_code in DENIED
    assert who.delete(f"/api/projects/{ls_id}/").status_code in DENIED
    # Still there, untouched, for its own team.
    ls = label_studio.client(project.team)
    assert ls.projects.get(id=ls_id).id == ls_id
    assert not [a for t in ls.tasks.list(project=ls_id, fields="all") for a in t.annotations or []]


def test_another_teams_annotator_reaches_no_project_of_the_team(client, teams):
    alpha_project, beta_project = teams["projects"]["alpha"], teams["projects"]["beta"]
    bob = hand_over(client, teams["bob"], teams["beta"], beta_project)
    # Bob works in his own team's project…
    assert beta_project.ls_project_id in project_ids(bob.get("/api/projects/"))
    # …and reaches nothing of Alpha's, through the session handed over or his own token.
    assert_no_access(bob, alpha_project)
    assert_no_access(bob.token(), alpha_project)
    # Alpha's annotator, for contrast, reaches Alpha's project.
    alice = hand_over(client, teams["alice"], teams["alpha"], alpha_project)
    assert alice.get(f"/api/projects/{alpha_project.ls_project_id}/").status_code == 200


def test_votes_of_accounts_that_are_no_labeling_members_do_not_count(client, teams):
    """Alice, an annotator of Alpha, makes two Label Studio accounts in Alpha's organisation
    (Label Studio lets any member do it) and votes with them against her own label. The sync
    rejects their votes with the reason; the majority export follows the members only; the
    next reconciliation puts the accounts out of the organisation."""
    project = teams["projects"]["alpha"]
    alice = hand_over(client, teams["alice"], teams["alpha"], project)
    task = task_ids(project)[1]
    puppets = []
    for _ in range(2):
        tag = uuid.uuid4().hex[:8]
        made = alice.post("/api/users/", json={"username": tag, "email": f"{tag}@example.com"})
        assert made.status_code == 201, made.text
        puppets.append(made.json()["id"])
    own = alice.post(f"/api/tasks/{task}/annotations/", json={"result": choice("正面")})
    assert own.status_code == 201, own.text
    service = TokenClient(label_studio_admin.team_token(teams["alpha"].pk))
    for puppet in puppets:
        # Alice cannot vote in their name (test_one_annotator_has_one_vote_in_own_name)…
        vote = alice.post(
            f"/api/tasks/{task}/annotations/",
            json={"result": choice("负面"), "completed_by": puppet},
        )
        assert vote.status_code in DENIED, vote.text
        # …the votes of such accounts, however made, do not count either.
        vote = service.post(
            f"/api/tasks/{task}/annotations/",
            json={"result": choice("负面"), "completed_by": puppet},
        )
        assert vote.status_code == 201, vote.text

    labeling_project_sync(project.pk)
    rejected = Annotation.objects.filter(project=project).exclude(rejected="")
    assert sorted(rejected.values_list("annotator_ls_id", flat=True)) == sorted(puppets)
    # Each is rejected with the reason, written in the language of whichever sync saw the votes
    # first: this one (English here) or one queued on the suite's worker (zh-hans).
    ending = "the annotation does not count."
    with translation.override("zh-hans"):
        endings = {
            ending,
            translation.gettext(
                "Made by a Label Studio account that is no platform member of the team: the "
                "annotation does not count."
            )[-8:],
        }
    assert all(a.rejected.endswith(tuple(endings)) for a in rejected), [
        a.rejected for a in rejected
    ]
    counted = Annotation.objects.get(project=project, rejected="")
    assert counted.annotator == "alice"
    # The project's page and API list them, with the reason.
    client.force_login(teams["olivia"])
    detail = client.get(f"/api/v1/teams/alpha/labeling-projects/{project.pk}/").json()
    assert detail["progress"]["annotations"] == 1 and detail["progress"]["rejected"] == 2
    assert {r["reason"] for r in detail["rejected"]} == {rejected.first().rejected}
    page = client.get(f"/t/alpha/labeling/{project.pk}/")
    assert b'data-testid="rejected"' in page.content

    job = import_run(
        labeling_project_export(actor=teams["olivia"], project=project, rule="majority").pk
    )
    import json

    from django.core.files.storage import default_storage

    version = job.version or job.identical_to
    assert version is not None, job.error
    with default_storage.open(version.data_file, "rb") as f:
        first = json.loads(f.readline())
    assert first["label"] == "正面"  # the outsiders' two votes decided nothing

    label_studio_members_converge()
    emails = {u.email for u in label_studio.client(teams["alpha"]).users.list()}
    assert not any(e.endswith("@example.com") for e in emails), emails


def test_removed_and_deactivated_members_lose_label_studio_access(client, teams):
    """Alice is removed from Alpha, Carol's user is deactivated: after the reconciliation
    neither their sessions nor their tokens reach Alpha's project."""
    from labeling.tasks import reconcile_labeling_projects

    project = teams["projects"]["alpha"]
    sessions = {n: hand_over(client, teams[n], teams["alpha"], project) for n in ("alice", "carol")}
    tokens = {n: s.token() for n, s in sessions.items()}
    for who in (*sessions.values(), *tokens.values()):
        assert who.get(f"/api/projects/{project.ls_project_id}/").status_code == 200

    Membership.objects.filter(team=teams["alpha"], user=teams["alice"]).delete()
    teams["carol"].is_active = False
    teams["carol"].save()
    from console.celery import app

    app.conf.task_always_eager = True
    try:
        reconcile_labeling_projects()
    finally:
        app.conf.task_always_eager = False
    for who in (*sessions.values(), *tokens.values()):
        assert_no_access(who, project)
    # Carol's account is switched off altogether: her session and token are refused.
    assert sessions["carol"].get("/api/current-user/whoami").status_code in DENIED
    assert tokens["carol"].get("/api/current-user/whoami").status_code in DENIED


class Recorder(http.server.BaseHTTPRequestHandler):
    requests: list

    def do_GET(self) -> None:
        self._record()

    def do_POST(self) -> None:
        self._record()

    def _record(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.requests.append((self.command, self.path, dict(self.headers), self.rfile.read(length)))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'[{"data": {"text": "internal secret"}}]')

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def internal_service():
    """An internal HTTP service on loopback that records who calls it."""
    handler = type("Handler", (Recorder,), {"requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler.requests
    server.shutdown()


def test_accounts_cannot_point_webhooks_or_imports_at_internal_addresses(
    client, teams, internal_service, settings
):
    """Alice's token cannot make Label Studio call loopback, private or link-local addresses
    (webhooks, URL imports); the platform's own webhook to loopback still arrives."""
    base, calls = internal_service
    project = teams["projects"]["alpha"]
    alice = hand_over(client, teams["alice"], teams["alpha"], project).token()
    for url in (f"{base}/steal", "http://10.0.0.1/", "http://169.254.169.254/latest/meta-data/"):
        hook = alice.post(
            "/api/webhooks/",
            json={"url": url, "project": project.ls_project_id, "send_for_all_actions": True},
        )
        assert hook.status_code in (400, 403), (url, hook.text)
    imported = alice.post(
        f"/api/projects/{project.ls_project_id}/import",
        data={"url": f"{base}/tasks.json"},
    )
    assert imported.status_code != 201 or not imported.json().get("task_count"), imported.text
    ls = label_studio.client(project.team)
    texts = [t.data.get("text") for t in ls.tasks.list(project=project.ls_project_id)]
    assert "internal secret" not in texts

    # The platform's webhook (its receiver's path on the platform's host) is delivered.
    settings.PLATFORM_URL = base
    labeling_project_webhook_register(project)
    ls.annotations.create(id=task_ids(project)[1], result=choice("正面"))
    deadline = time.monotonic() + 30
    while not any(path.startswith("/hooks/label-studio/") for _m, path, _h, _b in calls):
        assert time.monotonic() < deadline, "the platform's webhook did not arrive"
        time.sleep(0.3)
    assert all(path.startswith("/hooks/label-studio/") for _m, path, _h, _b in calls), calls
    (hook,) = [h for _m, p, h, _b in calls if p.startswith("/hooks/")][:1]
    assert WEBHOOK_SECRET_HEADER.lower() in {k.lower() for k in hook}


def test_console_logout_ends_the_label_studio_session(client, teams):
    project = teams["projects"]["alpha"]
    client.force_login(teams["alice"])
    response = client.get(f"/t/alpha/labeling/{project.pk}/open/")
    alice = Browser(response.cookies["sessionid"].value)
    assert alice.get("/api/current-user/whoami").status_code == 200
    token = alice.token()  # made from the session: it goes with it

    assert client.post("/logout/").status_code in (200, 302)
    assert alice.get("/api/current-user/whoami").status_code in DENIED
    assert token.get("/api/current-user/whoami").status_code in DENIED
    assert alice.get(f"/api/projects/{project.ls_project_id}/").status_code in DENIED


def test_the_hand_over_writes_no_invite_url_to_the_log(client, teams, caplog):
    """Label Studio's invite URL carries its organisation's token: the hand-over of a new
    account neither uses one nor writes one to the platform's log."""
    caplog.set_level(logging.INFO)  # the web log's level (LOG_LEVEL)
    hand_over(client, teams["carol"], teams["alpha"], teams["projects"]["alpha"])
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "?token=" not in text and "/user/signup" not in text and "/api/invite" not in text


def organisation_of(team) -> int:
    return label_studio_admin.team_ensure(team)["organization"]


def test_a_member_cannot_switch_into_another_teams_organisation(client, teams):
    """Bob (Beta) writes Alpha's organisation into his account's active organisation, the one
    most of Label Studio's routes scope by, then goes through them for Alpha's project."""
    project = teams["projects"]["alpha"]
    ls_id, task = project.ls_project_id, task_ids(project)[1]
    service = TokenClient(label_studio_admin.team_token(teams["alpha"].pk))
    made = service.post(
        "/api/predictions/", json={"task": task, "result": choice("正面"), "model_version": "m"}
    )
    assert made.status_code == 201, made.text
    labeling_project_webhook_register(project)  # its secret header is in the list
    alpha_org = organisation_of(teams["alpha"])
    alpha_service = f"team-{teams['alpha'].pk}@{label_studio.settings.LABEL_STUDIO_ACCOUNT_DOMAIN}"
    session = hand_over(client, teams["bob"], teams["beta"], teams["projects"]["beta"])
    token = session.token()
    me = token.get("/api/current-user/whoami").json()
    for who in (session, token):
        switch = who.patch(f"/api/users/{me['id']}/", json={"active_organization": alpha_org})
        assert switch.status_code != 200 or switch.json()["active_organization"] != alpha_org
        assert token.get("/api/current-user/whoami").json()["active_organization"] != alpha_org

    for who in (session, token):
        assert_no_access(who, project)
        wiped = who.delete(f"/api/projects/{ls_id}/tasks/")
        assert wiped.status_code in DENIED, wiped.text
        imported = who.post(f"/api/projects/{ls_id}/import", json=[{"text": "偷偷加的"}])
        assert imported.status_code in DENIED, imported.text
        predictions = who.get("/api/predictions/", params={"project": ls_id})
        assert predictions.status_code in DENIED or not [
            p for p in predictions.json() if p["task"] == task
        ], predictions.text
        hooks = who.get("/api/webhooks/")
        assert hooks.status_code in DENIED or not [
            h for h in hooks.json() if h.get("project") == ls_id
        ], hooks.text
        assert WEBHOOK_SECRET_HEADER.lower() not in hooks.text.lower()  # not even Beta's
        people = who.get("/api/users/").json()
        people = people["results"] if isinstance(people, dict) else people
        assert alpha_service not in {u["email"] for u in people}
    ls = label_studio.client(teams["alpha"])
    texts = {t.data.get("text") for t in ls.tasks.list(project=ls_id)}
    assert texts == {"房间干净", "早餐很差", "服务热情"}


def test_switching_teams_in_label_studio_is_limited_per_user(client, teams, make_user, settings):
    """Each change of the team one labels in is a run of Label Studio's Django, and the runs
    take turns on the host: a member of two teams alternating hand-offs is refused past the
    hour's limit, before any run, and goes on labeling in the team they are in."""
    settings.LABEL_STUDIO_SWITCHES_PER_HOUR = 1
    dana = make_user("dana")
    for team in (teams["alpha"], teams["beta"]):
        Membership.objects.create(team=team, user=dana, role=Role.ANNOTATOR)
    alpha, beta = teams["projects"]["alpha"], teams["projects"]["beta"]
    hand_over(client, dana, teams["alpha"], alpha)  # the account is made: no change
    hand_over(client, dana, teams["beta"], beta)  # the one change this hour allows
    refused = client.get(f"/t/alpha/labeling/{alpha.pk}/open/", follow=True)
    assert refused.redirect_chain[0][0] == f"/t/alpha/labeling/{alpha.pk}/"
    assert "本小时切换标注团队的次数过多" in refused.content.decode()
    assert LabelStudioAccount.objects.get(user=dana).active_team == teams["beta"]
    # Still working in Beta's organisation, whose project opens.
    session = hand_over(client, dana, teams["beta"], beta)
    me = session.get("/api/current-user/whoami").json()
    assert me["active_organization"] == organisation_of(teams["beta"])
    assert session.get(f"/api/projects/{beta.ls_project_id}/").status_code == 200


def test_tasks_and_predictions_cannot_be_written_into_another_teams_project(client, teams):
    """Bob (Beta) names Alpha's project in ``POST /api/tasks/`` and Alpha's task in
    ``POST /api/predictions/``: Label Studio looked them up by id and wrote."""
    project = teams["projects"]["alpha"]
    task = task_ids(project)[1]
    bob = hand_over(client, teams["bob"], teams["beta"], teams["projects"]["beta"]).token()
    made = bob.post("/api/tasks/", json={"project": project.ls_project_id, "data": {"text": "x"}})
    assert made.status_code in DENIED, made.text
    predicted = bob.post(
        "/api/predictions/", json={"task": task, "result": choice("负面"), "model_version": "m"}
    )
    assert predicted.status_code in (*DENIED, 400), predicted.text
    ls = label_studio.client(teams["alpha"])
    tasks = list(ls.tasks.list(project=project.ls_project_id, fields="all"))
    assert len(tasks) == 3
    assert not [p for t in tasks for p in t.predictions or []]
    # In his own team's project, Bob still writes.
    own = bob.post(
        "/api/tasks/",
        json={"project": teams["projects"]["beta"].ls_project_id, "data": {"text": "x"}},
    )
    assert own.status_code == 201, own.text


def test_one_annotator_has_one_vote_in_own_name(client, teams):
    """Alice posts a task's annotation three times, one more in Carol's name, and changes
    Carol's: Carol's answer and Alice's make a tie, not Alice's majority."""
    project = teams["projects"]["alpha"]
    task = task_ids(project)[1]
    carol = hand_over(client, teams["carol"], teams["alpha"], project)
    alice = hand_over(client, teams["alice"], teams["alpha"], project)
    carols = carol.post(f"/api/tasks/{task}/annotations/", json={"result": choice("正面")})
    assert carols.status_code == 201, carols.text
    carol_id = carols.json()["completed_by"]
    for _ in range(3):
        vote = alice.post(f"/api/tasks/{task}/annotations/", json={"result": choice("负面")})
        assert vote.status_code == 201, vote.text
    forged = alice.post(
        f"/api/tasks/{task}/annotations/",
        json={"result": choice("负面"), "completed_by": carol_id},
    )
    assert forged.status_code in DENIED, forged.text
    changed = alice.patch(
        f"/api/annotations/{carols.json()['id']}/", json={"result": choice("负面")}
    )
    assert changed.status_code in DENIED, changed.text
    assert alice.delete(f"/api/annotations/{carols.json()['id']}/").status_code in DENIED

    labeling_project_sync(project.pk)
    answers = selectors.labeling_project_answers(project)[1]
    assert sorted(who for who, _v in answers) == ["alice", "carol"]
    assert consensus.resolve(answers, "majority") is None  # a tie: no majority
    assert selectors.labeling_project_progress(project)["per_annotator"] == {"alice": 1, "carol": 1}


def test_a_password_change_ends_label_studio_sessions_and_tokens(
    client, teams, django_capture_on_commit_callbacks
):
    from console import services as console_services

    project = teams["projects"]["alpha"]
    alice = hand_over(client, teams["alice"], teams["alpha"], project)
    token = alice.token()
    assert token.get("/api/current-user/whoami").status_code == 200
    with django_capture_on_commit_callbacks(execute=True):
        console_services.user_set_password(
            actor=teams["alice"], user=teams["alice"], password="a-New-pw-4711-xyz"
        )
    assert alice.get("/api/current-user/whoami").status_code in DENIED
    assert token.get("/api/current-user/whoami").status_code in DENIED
    assert_no_access(token, project)


def test_a_service_account_made_in_advance_is_not_adopted(client, teams, make_team, settings):
    """Bob makes ``team-<id>@<domain>`` before the platform makes the team's organisation:
    the organisation gets a service account of its own, and Bob's account none of it."""
    bob = hand_over(client, teams["bob"], teams["beta"], teams["projects"]["beta"]).token()
    gamma = make_team("Gamma", {teams["oscar"]: Role.OWNER})
    email = f"team-{gamma.pk}@{settings.LABEL_STUDIO_ACCOUNT_DOMAIN}"
    made = bob.post("/api/users/", json={"username": f"team-{gamma.pk}", "email": email})
    assert made.status_code == 201, made.text
    ensured = label_studio_admin.team_ensure(gamma)
    assert ensured["user"] != made.json()["id"]
    people = label_studio.client(gamma).users.list()
    assert made.json()["id"] not in {u.id for u in people}


def label_studio_server_pids() -> list[int]:
    from pathlib import Path

    port = label_studio.settings.LABEL_STUDIO_URL.rsplit(":", 1)[-1]
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"label-studio") for a in argv) and port.encode() in argv:
            found.append(int(proc.name))
    return found


def test_label_studio_runs_without_the_platforms_secrets():
    """Label Studio's S3 storage falls back to AWS_* variables: whatever an account makes it
    run, the platform's secrets are not in its environment."""
    import os
    from pathlib import Path

    pids = label_studio_server_pids()
    if not pids:
        pytest.skip("Label Studio runs elsewhere (LABEL_STUDIO_URL given): its process is not here")
    assert "REDIS_URL" in os.environ  # the platform's, that Label Studio must not get
    for pid in pids:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        names = {e.split(b"=", 1)[0].decode() for e in environ if e}
        leaked = {
            n
            for n in names
            if n.startswith("AWS_")
            or n
            in {"REDIS_URL", "SECRET_KEY", "SERVING_SECRET", "DATABASE_URL", "LABEL_STUDIO_TOKEN"}
        }
        assert not leaked, (pid, leaked)


def test_the_webhook_exception_holds_for_the_platforms_port_only(tmp_path):
    """The private-address guard's one exception, the platform's receiver path on loopback, is
    pinned to PLATFORM_URL's port: not a way to reach another service on loopback."""
    import importlib.util
    import json
    import subprocess
    from pathlib import Path

    from django.conf import settings

    path = Path(settings.BASE_DIR) / "platform" / "label_studio.py"
    spec = importlib.util.spec_from_file_location("platform_label_studio", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    env = module.admin_env(
        tmp_path, {"PATH": "/usr/bin:/bin", "PLATFORM_URL": "http://127.0.0.1:8000"}
    )
    urls = [
        "http://127.0.0.1:8000/hooks/label-studio/1/",
        "http://localhost:8000/hooks/label-studio/1/",
        "http://127.0.0.1:6379/hooks/label-studio/1/",
        "http://127.0.0.1/hooks/label-studio/1/",
    ]
    script = (
        "import json, pathlib, sys, django, label_studio\n"
        "sys.path.insert(0, str(pathlib.Path(label_studio.__file__).parent))\n"
        "django.setup()\n"
        "from platform_ls.apps import is_platform_webhook\n"
        f"print(json.dumps([is_platform_webhook(u) for u in {urls!r}]))\n"
    )
    python = Path(module.binary()).with_name("python")
    done = subprocess.run(
        [str(python), "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [True, True, False, False]
