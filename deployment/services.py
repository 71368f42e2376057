"""Every write of the deployment app: endpoints and their rollouts, API keys, the convergence
of serving hosts to the database, metrics collection, and pre-annotation.

Rollout (``deployment/README.md`` has the diagram): an endpoint's active revisions share 100 %
of its traffic. The stable revision is the last good one; a canary takes a share from it and is
promoted (it becomes the stable one, at 100 %) or rolled back (all traffic returns to the
stable revision). Rolling back with no canary returns to the revision the stable one replaced.
"""

import json
import logging
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.core.files.storage import default_storage
from django.db import transaction
from django.db.models import Max
from django.utils import timezone
from django.utils.text import slugify
from django.utils.translation import gettext as _

from console.hardware import profile, profiles
from console.models import Team
from console.services import audit_record, key_expiry
from deployment.hosts import HostClient, HostError, platform_key_hash
from deployment.models import (
    Endpoint,
    EndpointKey,
    MetricSample,
    Placement,
    Revision,
    ServingHost,
)
from labeling import selectors as labeling_selectors
from labeling.models import LabelingProject
from labeling.services import labeling_project_preannotate
from runtime.data import OBJECTIVES
from serving.engines import BUILTIN, ENGINES
from serving.metrics import COUNTERS
from training import storage
from training.models import ModelVersion

log = logging.getLogger(__name__)

EXPORT = "export/"


def _converge_soon() -> None:
    """Have the reconciler bring the hosts in step once this transaction has committed."""
    from deployment import tasks

    transaction.on_commit(lambda: tasks.reconcile_endpoints.delay())


# -- endpoints and rollout ---------------------------------------------------------------------


def _check_knobs(
    device_type: str,
    replicas: int,
    max_batch_size: int,
    max_wait_ms: float,
    engine: str = BUILTIN,
    version: ModelVersion | None = None,
):
    if device_type not in profiles():
        raise ValidationError(_("Unknown device type %(d)s.") % {"d": device_type})
    if engine != BUILTIN:
        if engine not in ENGINES:
            raise ValidationError(
                _("Unknown engine %(e)s; engines: %(all)s.")
                % {"e": engine, "all": ", ".join([BUILTIN, *ENGINES])}
            )
        if version is not None and version.task_kind not in OBJECTIVES:
            raise ValidationError(_("Only large models run on an LLM engine."))
        if device_type not in ENGINES[engine]["devices"]:
            raise ValidationError(
                _("%(e)s serves %(devices)s, not %(d)s.")
                % {"e": engine, "devices": ", ".join(ENGINES[engine]["devices"]), "d": device_type}
            )
    if not 1 <= replicas <= 16:
        raise ValidationError(_("Replicas must be between 1 and 16."))
    if not 1 <= max_batch_size <= 256:
        raise ValidationError(_("The max batch size must be between 1 and 256."))
    if not 0 <= max_wait_ms <= 1000:
        raise ValidationError(_("The max wait must be between 0 and 1000 ms."))


def _check_version(team: Team, version: ModelVersion, task_kind: str | None = None) -> None:
    if version.team_id != team.pk:
        raise ValidationError(_("That model version belongs to another team."))
    if not any(path.startswith(EXPORT) for path in version.files):
        raise ValidationError(_("%(m)s has no exported model to serve.") % {"m": version})
    if task_kind and version.task_kind != task_kind:
        raise ValidationError(
            _("%(m)s is a %(kind)s model; this endpoint serves %(served)s.")
            % {"m": version, "kind": version.task_kind, "served": task_kind}
        )


def _endpoint_name(team: Team, name: str, version: ModelVersion) -> str:
    if name:
        slug = slugify(name)
        if slug != name or not slug:
            raise ValidationError(
                _("An endpoint name uses lower-case letters, digits and hyphens only.")
            )
        if Endpoint.objects.filter(name=slug).exists():
            raise ValidationError(_("The endpoint name %(n)s is taken.") % {"n": slug})
        return slug
    base = (slugify(version.name) or f"{team.slug}-model")[:50]
    slug, n = base, 1
    while Endpoint.objects.filter(name=slug).exists():
        n += 1
        slug = f"{base}-{n}"
    return slug


def _new_revision(endpoint: Endpoint, version: ModelVersion, actor, weight: int, **knobs):
    number = (endpoint.revisions.aggregate(n=Max("number"))["n"] or 0) + 1
    return Revision.objects.create(
        endpoint=endpoint,
        number=number,
        model_version=version,
        weight=weight,
        created_by=actor,
        **knobs,
    )


@transaction.atomic
def endpoint_deploy(
    *,
    actor: AbstractBaseUser,
    team: Team,
    model_version: ModelVersion,
    name: str = "",
    description: str = "",
    device_type: str = "cpu",
    replicas: int = 1,
    max_batch_size: int = 32,
    max_wait_ms: float = 5.0,
    max_inputs: int = 64,
    engine: str = BUILTIN,
) -> Endpoint:
    """A new endpoint serving ``model_version`` with all of its traffic."""
    _check_version(team, model_version)
    _check_knobs(device_type, replicas, max_batch_size, max_wait_ms, engine, model_version)
    if not 1 <= max_inputs <= 256:
        raise ValidationError(_("Inputs per request must be between 1 and 256."))
    endpoint = Endpoint.objects.create(
        team=team,
        name=_endpoint_name(team, name.strip(), model_version),
        description=description,
        task_kind=model_version.task_kind,
        max_inputs=max_inputs,
        created_by=actor,
    )
    revision = _new_revision(
        endpoint,
        model_version,
        actor,
        100,
        device_type=device_type,
        replicas=replicas,
        max_batch_size=max_batch_size,
        max_wait_ms=max_wait_ms,
        engine=engine,
    )
    revision.promoted_at = timezone.now()
    revision.save(update_fields=["promoted_at"])
    endpoint.stable_revision = revision
    endpoint.save(update_fields=["stable_revision"])
    audit_record(
        action="endpoint.deploy",
        actor=actor,
        team=team,
        target=endpoint,
        data={"model_version": str(model_version), "revision": revision.number},
    )
    _converge_soon()
    return endpoint


def _lock(endpoint: Endpoint) -> Endpoint:
    return Endpoint.objects.select_for_update().get(pk=endpoint.pk)


def _active(endpoint: Endpoint):
    return endpoint.revisions.filter(status=Revision.Status.ACTIVE)


def _rebalance(endpoint: Endpoint) -> None:
    """The stable revision takes whatever share the canaries leave."""
    canaries = _active(endpoint).exclude(pk=endpoint.stable_revision_id)
    taken = sum(r.weight for r in canaries)
    if taken > 100:
        raise ValidationError(_("The canaries' shares would add up to more than 100."))
    _active(endpoint).filter(pk=endpoint.stable_revision_id).update(weight=100 - taken)


@transaction.atomic
def revision_add(
    *,
    actor: AbstractBaseUser,
    endpoint: Endpoint,
    model_version: ModelVersion,
    weight: int = 10,
    device_type: str = "cpu",
    replicas: int = 1,
    max_batch_size: int = 32,
    max_wait_ms: float = 5.0,
    engine: str = BUILTIN,
) -> Revision:
    """A canary: ``model_version`` takes ``weight`` % of the traffic once it is ready."""
    endpoint = _lock(endpoint)
    _check_version(endpoint.team, model_version, endpoint.task_kind)
    _check_knobs(device_type, replicas, max_batch_size, max_wait_ms, engine, model_version)
    if not 0 <= weight <= 100:
        raise ValidationError(_("A traffic share is between 0 and 100 %."))
    revision = _new_revision(
        endpoint,
        model_version,
        actor,
        weight,
        device_type=device_type,
        replicas=replicas,
        max_batch_size=max_batch_size,
        max_wait_ms=max_wait_ms,
        engine=engine,
    )
    _rebalance(endpoint)
    audit_record(
        action="endpoint.canary",
        actor=actor,
        team=endpoint.team,
        target=endpoint,
        data={"revision": revision.number, "model_version": str(model_version), "weight": weight},
    )
    _converge_soon()
    return revision


@transaction.atomic
def revision_set_weight(*, actor: AbstractBaseUser, revision: Revision, weight: int) -> Revision:
    endpoint = _lock(revision.endpoint)
    revision.refresh_from_db()
    if revision.status != Revision.Status.ACTIVE or revision.pk == endpoint.stable_revision_id:
        raise ValidationError(
            _("Only a canary's share can be set; the stable revision takes the rest.")
        )
    if not 0 <= weight <= 100:
        raise ValidationError(_("A traffic share is between 0 and 100 %."))
    before = revision.weight
    revision.weight = weight
    revision.save(update_fields=["weight"])
    _rebalance(endpoint)
    audit_record(
        action="endpoint.traffic",
        actor=actor,
        team=endpoint.team,
        target=endpoint,
        data={"revision": revision.number, "from": before, "to": weight},
    )
    _converge_soon()
    return revision


def _retire(revisions) -> None:
    revisions.update(status=Revision.Status.RETIRED, weight=0, retired_at=timezone.now())


@transaction.atomic
def revision_promote(*, actor: AbstractBaseUser, revision: Revision) -> Revision:
    """The canary becomes the stable revision with all the traffic; the rest retire."""
    endpoint = _lock(revision.endpoint)
    revision.refresh_from_db()
    if revision.status != Revision.Status.ACTIVE:
        raise ValidationError(_("A retired revision cannot be promoted; add it again."))
    if revision.pk == endpoint.stable_revision_id:
        raise ValidationError(_("This revision is already the stable one."))
    _retire(_active(endpoint).exclude(pk=revision.pk))
    revision.weight = 100
    revision.replaced_id = endpoint.stable_revision_id
    revision.promoted_at = timezone.now()
    revision.save(update_fields=["weight", "replaced", "promoted_at"])
    endpoint.stable_revision = revision
    endpoint.save(update_fields=["stable_revision"])
    audit_record(
        action="endpoint.promote",
        actor=actor,
        team=endpoint.team,
        target=endpoint,
        data={"revision": revision.number, "model_version": str(revision.model_version)},
    )
    _converge_soon()
    return revision


@transaction.atomic
def endpoint_rollback(*, actor: AbstractBaseUser, endpoint: Endpoint) -> Revision:
    """All traffic back to the last good revision: the stable one when canaries run, else the
    revision the stable one replaced at its promotion."""
    endpoint = _lock(endpoint)
    stable = endpoint.stable_revision
    canaries = _active(endpoint).exclude(pk=endpoint.stable_revision_id)
    # Without a stable revision there is nothing good to return to.
    if stable is not None and canaries.exists():
        target, left = stable, [r.number for r in canaries]
        _retire(canaries)
    elif stable is not None and stable.replaced_id is not None:
        target, left = stable.replaced, [stable.number]
        _retire(_active(endpoint).exclude(pk=target.pk))
        target.status, target.retired_at = Revision.Status.ACTIVE, None
        target.replaced = None
        endpoint.stable_revision = target
        endpoint.save(update_fields=["stable_revision"])
    elif stable is None:
        raise ValidationError(
            _("There is nothing to roll back to: the endpoint has no stable revision yet.")
        )
    else:
        raise ValidationError(
            _("There is nothing to roll back: no canary and no earlier revision.")
        )
    target.weight = 100
    target.save(update_fields=["weight", "status", "retired_at", "replaced"])
    audit_record(
        action="endpoint.rollback",
        actor=actor,
        team=endpoint.team,
        target=endpoint,
        data={"to_revision": target.number, "retired": left},
    )
    _converge_soon()
    return target


@transaction.atomic
def endpoint_delete(*, actor: AbstractBaseUser, endpoint: Endpoint) -> None:
    audit_record(action="endpoint.delete", actor=actor, team=endpoint.team, target=endpoint)
    endpoint.delete()
    _converge_soon()


def refuse_deleting_served_version(version: ModelVersion) -> None:
    """A model version that serves traffic cannot be deleted (training's delete calls this)."""
    names = sorted(
        set(
            Revision.objects.filter(
                model_version=version, status=Revision.Status.ACTIVE
            ).values_list("endpoint__name", flat=True)
        )
    )
    if names:
        raise ValidationError(
            _("%(m)s serves traffic on %(e)s: roll it out of the endpoint(s) first.")
            % {"m": version, "e": ", ".join(names)}
        )


# -- API keys ----------------------------------------------------------------------------------


@transaction.atomic
def endpoint_key_create(
    *,
    actor: AbstractBaseUser,
    endpoint: Endpoint,
    name: str,
    rate_per_s: float | None = None,
    expires_in_days: int | None = None,
) -> tuple[EndpointKey, str]:
    """A key for ``endpoint``; the plain key is returned once and only its hash is kept.

    Unlike personal tokens, an endpoint key never expires unless asked to: it lives in an
    application's configuration, where a silent expiry is an outage; revocation is the tool."""
    name = name.strip()
    if not name:
        raise ValidationError(_("A key needs a name."))
    if rate_per_s is not None and rate_per_s <= 0:
        raise ValidationError(_("A rate limit is a positive number of requests per second."))
    expires_at = key_expiry(expires_in_days)
    key, plain = EndpointKey.issue(
        endpoint=endpoint, name=name, rate_per_s=rate_per_s, created_by=actor, expires_at=expires_at
    )
    audit_record(
        action="endpoint.key_create",
        actor=actor,
        team=endpoint.team,
        target=endpoint,
        data={
            "key": key.name,
            "prefix": key.prefix,
            "rate_per_s": rate_per_s,
            "expires_at": expires_at.isoformat() if expires_at else None,
        },
    )
    _converge_soon()
    return key, plain


@transaction.atomic
def endpoint_key_revoke(*, actor: AbstractBaseUser, key: EndpointKey) -> EndpointKey:
    if key.revoke():
        audit_record(
            action="endpoint.key_revoke",
            actor=actor,
            team=key.endpoint.team,
            target=key.endpoint,
            data={"key": key.name, "prefix": key.prefix},
        )
        _converge_soon()
    return key


# -- convergence -------------------------------------------------------------------------------


def export_dir(version: ModelVersion) -> Path:
    """Where a serving host on this storage finds the version's export: the storage's own
    directory on a filesystem (local or NFS), else a checked local copy."""
    try:
        return Path(default_storage.path(version.storage_prefix + "export"))
    except NotImplementedError:
        local = Path(settings.SERVING_CACHE_DIR) / str(version.uid)
        if not (local / ".complete").exists():
            files = {k: v for k, v in version.files.items() if k.startswith(EXPORT)}
            storage.fetch_dir(version.storage_prefix, files, local)
            (local / ".complete").touch()
        return local / "export"


def revision_config(revision: Revision) -> dict:
    """What the serving host is told to load; a change of any of it is a reload."""
    version = revision.model_version
    return {
        "export_dir": str(export_dir(version)),
        "manifest_sha256": version.files.get("export/manifest.json", {}).get("sha256", ""),
        "model": f"{version.name} v{version.number}",
        "device": profile(revision.device_type).paddle_device,
        "replicas": revision.replicas,
        "max_batch_size": revision.max_batch_size,
        "max_wait_ms": float(revision.max_wait_ms),
        # An external engine's own server instead of the platform's processes.
        **({"engine": revision.engine} if revision.engine != BUILTIN else {}),
    }


def _placement(revision: Revision, host: ServingHost, described: dict | None, error: str = ""):
    state = (described or {}).get("state", Placement.State.MISSING)
    if state not in Placement.State.values:
        state = Placement.State.LOADING
    Placement.objects.update_or_create(
        revision=revision,
        host=host,
        defaults={
            "state": state,
            "error": error or (described or {}).get("error", ""),
            "replicas_ready": (described or {}).get("replicas_ready", 0),
            "updated_at": timezone.now(),
        },
    )


def endpoints_reconcile() -> dict[str, str]:
    """Bring every serving host in step with the database; {host url: "ok" or the error}."""
    out = {}
    for url in settings.SERVING_HOSTS:
        host, _created = ServingHost.objects.get_or_create(url=url)
        try:
            host_reconcile(host)
            out[url] = "ok"
        except HostError as exc:
            host.reachable, host.error, host.checked_at = False, str(exc), timezone.now()
            host.save(update_fields=["reachable", "error", "checked_at"])
            out[url] = str(exc)
    return out


RETRY_FAILED_AFTER = timedelta(seconds=60)


def host_reconcile(host: ServingHost) -> None:
    """Load what the host lacks, route every endpoint, unload what is no longer wanted. A
    revision being replaced stays loaded until its endpoint's revisions are ready there."""
    client = HostClient(host.url)
    state = client.state()
    now = timezone.now()
    host.devices, host.boot_id = state["devices"], state["boot_id"]
    host.reachable, host.error, host.checked_at, host.last_seen_at = True, "", now, now
    host.save(
        update_fields=["devices", "boot_id", "reachable", "error", "checked_at", "last_seen_at"]
    )
    loaded: dict[str, dict] = dict(state["revisions"])

    wanted = list(
        Revision.objects.filter(status=Revision.Status.ACTIVE, device_type__in=host.devices)
        .select_related("model_version", "endpoint")
        .order_by("pk")
    )
    placements = {p.revision_id: p for p in Placement.objects.filter(host=host)}
    for rev in wanted:
        have = loaded.get(rev.key)
        try:
            config = revision_config(rev)
        except (OSError, ValueError) as exc:
            _placement(rev, host, None, error=_("The export cannot be read: %(e)s") % {"e": exc})
            continue
        if have is None or have["config"] != config:
            loaded[rev.key] = have = client.load(rev.key, config)
        elif have["state"] == Placement.State.FAILED:
            # A failure is recorded with its time and the reason, and loaded again a minute
            # later (a file that was still being copied, a device that was busy).
            placed = placements.get(rev.pk)
            if placed is None or placed.state != Placement.State.FAILED:
                _placement(rev, host, have)
                continue
            if now - placed.updated_at < RETRY_FAILED_AFTER:
                continue
            loaded[rev.key] = have = client.load(rev.key, config)
        _placement(rev, host, have)

    wanted_keys = {rev.key for rev in wanted}
    by_endpoint: dict[int, list[Revision]] = {}
    for rev in wanted:
        by_endpoint.setdefault(rev.endpoint_id, []).append(rev)
    # Revisions loaded here but no longer wanted: kept while their endpoint has no ready
    # revision with traffic on this host yet (make before break), then unloaded.
    keep: dict[int, list[str]] = {}
    for key in set(loaded) - wanted_keys:
        old = Revision.objects.filter(pk=_revision_pk(key)).first()
        revs = by_endpoint.get(old.endpoint_id, []) if old else []
        ready = all(loaded.get(r.key, {}).get("state") == "ready" for r in revs if r.weight)
        if old is not None and revs and not ready and loaded[key]["state"] == "ready":
            keep.setdefault(old.endpoint_id, []).append(key)
        else:
            client.unload(key)
            Placement.objects.filter(host=host, revision_id=_revision_pk(key)).delete()

    endpoints = Endpoint.objects.filter(pk__in=by_endpoint).prefetch_related("keys")
    for endpoint in endpoints:
        table = {r.key: r.weight for r in by_endpoint[endpoint.pk]}
        table.update(dict.fromkeys(keep.get(endpoint.pk, []), 0))
        # The host checks the expiry itself: a key may expire between two convergences.
        keys = {
            k.key_hash: {
                "id": k.pk,
                "rate_per_s": k.rate_per_s,
                "expires_at": k.expires_at.timestamp() if k.expires_at else None,
            }
            for k in endpoint.keys.all()
            if k.revoked_at is None  # an expired key too: the host says it expired
        }
        client.route(
            endpoint.name,
            {
                "revisions": table,
                "keys": keys,
                "max_inputs": endpoint.max_inputs,
                # The platform's own calls (try-it, playground, pre-annotation) use this key.
                "platform_key": platform_key_hash(endpoint.name),
            },
        )
    routed = {e.name for e in endpoints}
    for name in set(state["endpoints"]) - routed:
        client.unroute(name)


def _revision_pk(key: str) -> int | None:
    prefix, _sep, pk = key.partition("-")
    return int(pk) if prefix == "rev" and pk.isdigit() else None


# -- metrics -----------------------------------------------------------------------------------


def metrics_collect(max_age_s: float = 0.0) -> int:
    """Scrape every reachable host's counters and store what changed since the last scrape;
    the number of samples written. Hosts scraped less than ``max_age_s`` ago are skipped."""
    written = 0
    for url in settings.SERVING_HOSTS:
        host, _created = ServingHost.objects.get_or_create(url=url)
        if host.metrics_at and (timezone.now() - host.metrics_at).total_seconds() < max_age_s:
            continue
        try:
            data = HostClient(host.url).metrics()
        except HostError as exc:
            log.info("metrics of %s: %s", url, exc)
            continue
        written += _metrics_store(host, data)
    return written


def metrics_prune() -> int:
    """Delete the samples older than ``SERVING_METRICS_RETENTION_DAYS``; how many."""
    cutoff = timezone.now() - timedelta(days=settings.SERVING_METRICS_RETENTION_DAYS)
    deleted, _per_model = MetricSample.objects.filter(at__lt=cutoff).delete()
    return deleted


HISTOGRAMS = ("latency", "ttft")


def _difference(now: list | None, was: list | None) -> list[int]:
    now = now or []
    was = was or [0] * len(now)
    return [a - b for a, b in zip(now, was, strict=False)]


@transaction.atomic
def _metrics_store(host: ServingHost, data: dict) -> int:
    host = ServingHost.objects.select_for_update().get(pk=host.pk)
    now = timezone.now()
    same_boot = host.metrics_boot_id == data["boot_id"]
    before = host.metrics_snapshot if same_boot else {}
    window = (now - host.metrics_at).total_seconds() if same_boot and host.metrics_at else 0.0
    endpoints = {e.name: e for e in Endpoint.objects.filter(name__in=list(data["endpoints"]))}
    samples = []
    for name, revisions in data["endpoints"].items():
        endpoint = endpoints.get(name)
        if endpoint is None:
            continue
        for key, now_counts in revisions.items():
            was = before.get(name, {}).get(key) or {}
            delta = {c: now_counts.get(c, 0) - was.get(c, 0) for c in COUNTERS}
            histograms = {h: _difference(now_counts.get(h), was.get(h)) for h in HISTOGRAMS}
            if min(*delta.values(), *histograms["latency"], *histograms["ttft"]) < 0:
                # Counters went back: a restart we missed.
                delta = {c: now_counts.get(c, 0) for c in COUNTERS}
                histograms = {h: list(now_counts.get(h) or []) for h in HISTOGRAMS}
            if not any(delta.values()):
                continue
            pk = _revision_pk(key)
            samples.append(
                MetricSample(
                    endpoint=endpoint,
                    revision_id=pk if pk and endpoint.revisions.filter(pk=pk).exists() else None,
                    host=host,
                    at=now,
                    window_s=window,
                    **histograms,
                    **delta,
                )
            )
    MetricSample.objects.bulk_create(samples)
    host.metrics_boot_id, host.metrics_snapshot, host.metrics_at = (
        data["boot_id"],
        data["endpoints"],
        now,
    )
    host.save(update_fields=["metrics_boot_id", "metrics_snapshot", "metrics_at"])
    return len(samples)


# -- calling an endpoint as the platform -------------------------------------------------------

# A draft's score: a chat endpoint gives no confidence, so every draft ranks alike.
DRAFT_SCORE = 0.5
DRAFT_MAX_TOKENS = 512


def endpoint_predict(*, endpoint: Endpoint, inputs: list, top_k: int = 5) -> tuple[int, dict]:
    """The endpoint's answer to ``inputs`` (the console's try-it box, pre-annotation), from the
    first host that serves it: (HTTP status, body). Counted in its metrics like any call."""
    errors = []
    for url in settings.SERVING_HOSTS:
        try:
            return HostClient(url).predict(endpoint.name, {"inputs": inputs, "top_k": top_k})
        except HostError as exc:
            errors.append(str(exc))
    raise HostError("; ".join(errors) or _("No serving host is configured."))


def endpoint_chat(*, endpoint: Endpoint, body: dict) -> Iterator[bytes]:
    """A generative endpoint's streamed answer to a chat (the console's playground), from the
    first serving host that is reachable. Counted in its metrics like any call."""
    errors = []
    for url in settings.SERVING_HOSTS:
        stream = HostClient(url).chat_stream({**body, "model": endpoint.name})
        try:
            first = next(stream)
        except HostError as exc:
            errors.append(str(exc))
            continue
        except StopIteration:
            return
        yield first
        yield from stream
        return
    message = "; ".join(errors) or _("No serving host is configured.")
    error = {"error": {"message": message, "type": "server_error", "code": "unreachable"}}
    yield b"data: " + json.dumps(error, ensure_ascii=False).encode() + b"\n\n"


# -- pre-annotation ----------------------------------------------------------------------------


def _confidence(kind: str, out: dict) -> tuple[dict, float]:
    """A prediction as the labeling app takes it, and how sure the model is (0..1)."""
    if kind == "ner":
        entities = [{k: e[k] for k in ("start", "end", "label")} for e in out["entities"]]
        scores = [e["score"] for e in out["entities"]]
        return {"entities": entities}, min(scores) if scores else 0.5
    if kind == "multi_label":
        labels = out["labels"] or [out["scores"][0]["label"]]
        sure = [max(s["score"], 1 - s["score"]) for s in out["scores"]]
        return {"labels": labels}, min(sure)
    return {"label": out["label"]}, out["score"]


@transaction.atomic
def preannotate_start(
    *, actor: AbstractBaseUser, project: LabelingProject, endpoint: Endpoint
) -> None:
    """Queue the pre-annotation of the project's unlabeled tasks by ``endpoint``."""
    from deployment import tasks

    if endpoint.team_id != project.team_id:
        raise ValidationError(_("That endpoint belongs to another team."))
    kind = project.source_version.dataset.task_kind
    if endpoint.task_kind != kind:
        raise ValidationError(
            _("%(e)s serves %(k)s models; the project labels %(p)s.")
            % {"e": endpoint.name, "k": endpoint.task_kind, "p": kind}
        )
    if project.ls_project_id is None:
        raise ValidationError(_("The project is not in Label Studio yet."))
    if kind == "preference":
        raise ValidationError(
            _(
                "Pre-annotation drafts the responses of instruction projects; people compare "
                "the pairs of preference projects."
            )
        )
    audit_record(
        action="labeling_project.preannotate_start",
        actor=actor,
        team=project.team,
        target=project,
        data={"endpoint": endpoint.name},
    )
    transaction.on_commit(lambda: tasks.preannotate_labeling_project.delay(project.pk, endpoint.pk))


def endpoint_chat_complete(*, endpoint: Endpoint, messages: list[dict]) -> str:
    """A generative endpoint's reply to ``messages`` (greedy), from the first reachable host."""
    errors = []
    body = {"model": endpoint.name, "messages": messages, "temperature": 0}
    for url in settings.SERVING_HOSTS:
        try:
            status, answer = HostClient(url).chat({**body, "max_tokens": DRAFT_MAX_TOKENS})
            if status == 400 and answer.get("error", {}).get("param") == "max_tokens":
                status, answer = HostClient(url).chat(body)  # the model's context is shorter
        except HostError as exc:
            errors.append(str(exc))
            continue
        if status != 200:
            message = answer.get("error", {}).get("message", "")
            raise HostError(f"{endpoint.name} answered {status}: {message}")
        return answer["choices"][0]["message"]["content"]
    raise HostError("; ".join(errors) or _("No serving host is configured."))


def _draft_responses(project: LabelingProject, endpoint: Endpoint, numbers, rows) -> int:
    """Drafts of the responses that nobody wrote yet, generated concurrently (the serving
    host batches them) and imported as predictions for annotators to correct."""
    from concurrent.futures import ThreadPoolExecutor

    from labeling.task_kinds import prompt_turns

    revision = endpoint.stable_revision
    workers = max(1, min(32, revision.max_batch_size if revision else 8))
    done = 0
    for start in range(0, len(numbers), workers * 4):
        chunk = numbers[start : start + workers * 4]

        def draft(n: int) -> str:
            return endpoint_chat_complete(
                endpoint=endpoint, messages=prompt_turns(rows[n]["messages"])
            )

        with ThreadPoolExecutor(workers) as pool:
            drafts = list(pool.map(draft, chunk))
        predictions = [
            {
                "row": n,
                "value": {
                    "messages": [
                        *prompt_turns(rows[n]["messages"]),
                        {"role": "assistant", "content": text},
                    ]
                },
                "score": DRAFT_SCORE,
            }
            for n, text in zip(chunk, drafts, strict=True)
            if text.strip()
        ]
        if predictions:
            done += labeling_project_preannotate(
                project=project, predictions=predictions, model_version=endpoint.name
            )
    return done


def preannotate_run(project_id: int, endpoint_id: int, batch_size: int | None = None) -> int:
    """Send the project's tasks that nobody labeled yet to the endpoint in batches and import
    the answers into Label Studio as predictions with scores (least confident served first);
    the number of predictions imported."""
    project = LabelingProject.objects.select_related("source_version__dataset", "team").get(
        pk=project_id
    )
    endpoint = Endpoint.objects.get(pk=endpoint_id, team=project.team)
    kind = project.source_version.dataset.task_kind
    labeled = set(project.annotations.values_list("task__row", flat=True))
    rows_wanted = sorted(set(project.tasks.values_list("row", flat=True)) - labeled)
    rows = labeling_selectors.rows_by_number(project.source_version, set(rows_wanted))
    if kind == "instruction":
        return _draft_responses(project, endpoint, rows_wanted, rows)
    size = batch_size or endpoint.max_inputs
    done = 0
    for start in range(0, len(rows_wanted), size):
        numbers = rows_wanted[start : start + size]
        inputs = [
            {"text_a": rows[n]["text_a"], "text_b": rows[n]["text_b"]}
            if kind == "text_pair"
            else rows[n]["text"]
            for n in numbers
        ]
        status, body = endpoint_predict(endpoint=endpoint, inputs=inputs, top_k=1)
        if status != 200:
            message = body.get("error", {}).get("message", "")
            raise HostError(f"{endpoint.name} answered {status}: {message}")
        predictions = []
        for n, out in zip(numbers, body["outputs"], strict=True):
            value, score = _confidence(kind, out)
            predictions.append({"row": n, "value": value, "score": round(score, 4)})
        done += labeling_project_preannotate(
            project=project,
            predictions=predictions,
            model_version=f"{endpoint.name}:{body.get('model', '')}",
        )
    return done
