"""The convergence of the serving hosts to the database (``deployment/README.md``,
"Convergence"): what each host loads (a revision's config), how each endpoint routes, what is
unloaded, and the placements the console shows. Every change of an endpoint or key asks for a
pass (``converge_soon``); beat runs one every 10 s whatever happens."""

from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.core.files.storage import default_storage
from django.db import transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _

from console.hardware import profile
from console.notifications import notify
from deployment.hosts import HostClient, HostError, platform_key_hash
from deployment.models import Endpoint, Placement, Revision, ServingHost
from runtime.inference import MANIFEST
from serving.engines import BUILTIN
from training import storage
from training.models import ModelVersion


def converge_soon() -> None:
    """Have the reconciler bring the hosts in step once this transaction has committed."""
    from deployment import tasks

    transaction.on_commit(lambda: tasks.reconcile_endpoints.delay())


def export_dir(version: ModelVersion) -> Path:
    """Where a serving host on this storage finds the version's export: the storage's own
    directory on a filesystem (local or NFS), else a checked local copy."""
    try:
        return Path(default_storage.path(version.storage_prefix + storage.MODEL_EXPORT))
    except NotImplementedError:
        local = Path(settings.SERVING_CACHE_DIR) / str(version.uid)
        if not (local / ".complete").exists():
            files = {k: v for k, v in version.files.items() if k.startswith(storage.MODEL_EXPORT)}
            storage.fetch_dir(version.storage_prefix, files, local)
            (local / ".complete").touch()
        return local / storage.MODEL_EXPORT


def revision_config(revision: Revision) -> dict:
    """What the serving host is told to load; a change of any of it but the adapters is a
    reload (the adapters are loaded and unloaded in place)."""
    from deployment.adapters import adapter_problem

    version = revision.model_version
    adapters = {
        a.name: {
            "export_dir": str(export_dir(a.model_version)),
            "manifest_sha256": _manifest_sha256(a.model_version),
        }
        for a in revision.endpoint.adapters.all()
        if adapter_problem(version, a.model_version) is None  # a canary of another base: not
    }
    return {
        "export_dir": str(export_dir(version)),
        "manifest_sha256": _manifest_sha256(version),
        "model": f"{version.name} v{version.number}",
        "device": profile(revision.device_type).paddle_device,
        "replicas": revision.replicas,
        "max_batch_size": revision.max_batch_size,
        "max_wait_ms": float(revision.max_wait_ms),
        # An external engine's own server instead of the platform's processes.
        **({"engine": revision.engine} if revision.engine != BUILTIN else {}),
        **({"adapters": adapters} if adapters else {}),
    }


def _manifest_sha256(version: ModelVersion) -> str:
    return version.files.get(storage.MODEL_EXPORT + MANIFEST, {}).get("sha256", "")


def _placement(revision: Revision, host: ServingHost, described: dict | None, error: str = ""):
    state = (described or {}).get("state", Placement.State.MISSING)
    if state not in Placement.State.values:
        state = Placement.State.LOADING
    before = Placement.objects.filter(revision=revision, host=host).values_list("state", flat=True)
    if state == Placement.State.FAILED and Placement.State.FAILED not in before:
        endpoint = revision.endpoint
        notify(
            endpoint.team,
            "endpoint_unhealthy",
            _("Endpoint %(name)s: revision %(n)d failed on %(host)s")
            % {"name": endpoint.name, "n": revision.number, "host": host.url},
            body=(error or (described or {}).get("error", ""))[:1000],
            link=reverse("deployment:endpoint", args=[endpoint.team.slug, endpoint.pk]),
        )
    Placement.objects.update_or_create(
        revision=revision,
        host=host,
        defaults={
            "state": state,
            "error": error or (described or {}).get("error", ""),
            "replicas_ready": (described or {}).get("replicas_ready", 0),
            "adapters": (described or {}).get("adapters") or {},
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
        .select_related("model_version__job", "endpoint")
        .prefetch_related("endpoint__adapters__model_version__job")
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
        old = Revision.objects.filter(pk=Revision.pk_from_key(key)).first()
        revs = by_endpoint.get(old.endpoint_id, []) if old else []
        ready = all(loaded.get(r.key, {}).get("state") == "ready" for r in revs if r.weight)
        if old is not None and revs and not ready and loaded[key]["state"] == "ready":
            keep.setdefault(old.endpoint_id, []).append(key)
        else:
            client.unload(key)
            Placement.objects.filter(host=host, revision_id=Revision.pk_from_key(key)).delete()

    endpoints = Endpoint.objects.filter(pk__in=by_endpoint).prefetch_related("keys", "adapters")
    for endpoint in endpoints:
        table = {r.key: r.weight for r in by_endpoint[endpoint.pk]}
        table.update(dict.fromkeys(keep.get(endpoint.pk, []), 0))
        # The host checks the expiry itself: a key may expire between two convergences.
        keys = {
            k.key_hash: {
                "id": k.pk,
                "rate_per_s": k.rate_per_s,
                "expires_at": k.expires_at.timestamp() if k.expires_at else None,
                "adapters": k.adapters or None,  # None: any
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
                "max_tokens": endpoint.max_tokens,
                "adapters": {a.name: {"rate_per_s": a.rate_per_s} for a in endpoint.adapters.all()},
                # The platform's own calls (try-it, playground, pre-annotation) use this key.
                "platform_key": platform_key_hash(endpoint.name),
            },
        )
    routed = {e.name for e in endpoints}
    for name in set(state["endpoints"]) - routed:
        client.unroute(name)
