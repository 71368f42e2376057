"""Endpoints and their rollout: deploy, canaries and their traffic shares, promotion, rollback,
deletion.

An endpoint's active revisions share 100 % of its traffic (``deployment/README.md`` has the
diagram). The stable revision is the last good one; a canary takes a share from it and is
promoted (it becomes the stable one, at 100 %) or rolled back (all traffic returns to the
stable revision). Rolling back with no canary returns to the revision the stable one replaced.
"""

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Max, Sum
from django.utils import timezone
from django.utils.text import slugify
from django.utils.translation import gettext as _

from console.hardware import profiles
from console.models import Team
from console.services import audit_record
from console.slugs import ascii_slug
from deployment.models import MAX_TOKENS_DEFAULT, MAX_TOKENS_LIMIT, Endpoint, Revision
from deployment.quality import audit_data, compare_with_serving
from deployment.reconcile import converge_soon
from runtime.kinds import GENERATIVE_KINDS
from serving.engines import BUILTIN, ENGINES
from training.models import ModelVersion
from training.storage import MODEL_EXPORT


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
        if version is not None and version.task_kind not in GENERATIVE_KINDS:
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


def _check_serving_quota(team: Team, *, endpoints: int, replicas: int) -> None:
    """Refuse ``endpoints`` more endpoints or ``replicas`` more predictor replicas past the
    team's quotas (``Team.max_endpoints``, ``max_replicas``, set by site staff), saying the use
    and the quota. ``team`` is locked by the caller, so that two deployments cannot both pass;
    replicas count those of every active revision of the team's endpoints."""
    if endpoints and team.max_endpoints is not None:
        have = Endpoint.objects.filter(team=team).count()
        if have + endpoints > team.max_endpoints:
            raise ValidationError(
                _(
                    "The team has %(have)d endpoints, and its quota is %(quota)d: delete one or "
                    "ask site staff for more."
                )
                % {"have": have, "quota": team.max_endpoints},
                code="quota",
            )
    if replicas and team.max_replicas is not None:
        active = Revision.objects.filter(endpoint__team=team, status=Revision.Status.ACTIVE)
        have = active.aggregate(n=Sum("replicas"))["n"] or 0
        if have + replicas > team.max_replicas:
            raise ValidationError(
                _(
                    "The team's endpoints run %(have)d predictor replicas; %(more)d more would "
                    "pass its quota of %(quota)d."
                )
                % {"have": have, "more": replicas, "quota": team.max_replicas},
                code="quota",
            )


def _check_version(team: Team, version: ModelVersion, task_kind: str | None = None) -> None:
    if version.team_id != team.pk:
        raise ValidationError(_("That model version belongs to another team."))
    if not any(path.startswith(MODEL_EXPORT) for path in version.files):
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
    base = (ascii_slug(version.name)[:50].strip("-") or f"{team.slug}-model")[:50]
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
    max_tokens: int = MAX_TOKENS_DEFAULT,
    engine: str = BUILTIN,
) -> Endpoint:
    """A new endpoint serving ``model_version`` with all of its traffic."""
    _check_version(team, model_version)
    _check_knobs(device_type, replicas, max_batch_size, max_wait_ms, engine, model_version)
    locked = Team.objects.select_for_update(no_key=True).get(pk=team.pk)
    _check_serving_quota(locked, endpoints=1, replicas=replicas)
    if not 1 <= max_inputs <= 256:
        raise ValidationError(_("Inputs per request must be between 1 and 256."))
    if not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        raise ValidationError(
            _("Tokens per reply must be between 1 and %(n)d.") % {"n": MAX_TOKENS_LIMIT}
        )
    endpoint = Endpoint.objects.create(
        team=team,
        name=_endpoint_name(team, name.strip(), model_version),
        description=description,
        task_kind=model_version.task_kind,
        max_inputs=max_inputs,
        max_tokens=max_tokens,
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
    converge_soon()
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
    team = Team.objects.select_for_update(no_key=True).get(pk=endpoint.team_id)
    endpoint = _lock(endpoint)
    _check_version(endpoint.team, model_version, endpoint.task_kind)
    _check_knobs(device_type, replicas, max_batch_size, max_wait_ms, engine, model_version)
    _check_serving_quota(team, endpoints=0, replicas=replicas)
    if not 0 <= weight <= 100:
        raise ValidationError(_("A traffic share is between 0 and 100 %."))
    # The quality gate warns (deployment.quality); it never refuses: the user decided.
    comparison = compare_with_serving(endpoint, model_version)
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
        data={
            "revision": revision.number,
            "model_version": str(model_version),
            "weight": weight,
            **audit_data(comparison),
        },
    )
    converge_soon()
    revision.comparison = comparison
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
    converge_soon()
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
    comparison = compare_with_serving(endpoint, revision.model_version)
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
        data={
            "revision": revision.number,
            "model_version": str(revision.model_version),
            **audit_data(comparison),
        },
    )
    converge_soon()
    revision.comparison = comparison
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
    converge_soon()
    return target


@transaction.atomic
def endpoint_delete(*, actor: AbstractBaseUser, endpoint: Endpoint) -> None:
    audit_record(action="endpoint.delete", actor=actor, team=endpoint.team, target=endpoint)
    endpoint.delete()
    converge_soon()


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
