"""The LoRA adapters a generative endpoint serves over its model (many adapters on one base):
which model versions fit, adding and removing them. The serving hosts load an adapter into the
running revisions without loading the model again (``serving/generative.py``); applications
call it as ``model="<endpoint>/<name>"``."""

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.translation import gettext as _

from console.services import audit_record
from deployment.models import MIN_RATE_PER_S, Endpoint, EndpointAdapter
from deployment.reconcile import converge_soon
from runtime.adapters import MAX_ADAPTERS, NAME
from runtime.generation import RUNTIMES as GENERATIVE_RUNTIMES
from runtime.kinds import GENERATIVE_KINDS
from runtime.presets import LLM_PRESETS
from training.models import ModelVersion


def _base_of(version: ModelVersion) -> tuple[str, int | None]:
    """The base model a version was fine-tuned from: its name, and its registry id where the
    version's job is known."""
    job = version.job
    return version.base, job.base_model_id if job is not None else None


def adapter_problem(served: ModelVersion, version: ModelVersion) -> str | None:
    """Why ``version``'s LoRA adapter cannot be served over ``served`` (the model version of a
    revision), or None when it can: both generative on one runtime, both fine-tuned with LoRA
    from the same imported base model (a preset's weights are random: each job's are its own)."""
    if version.runtime not in GENERATIVE_RUNTIMES or served.runtime not in GENERATIVE_RUNTIMES:
        return _("Only large models serve adapters.")
    if not (version.manifest or {}).get("adapter_dir"):
        return _("%(m)s was not fine-tuned with LoRA: it has no adapter.") % {"m": version}
    if not (served.manifest or {}).get("adapter_dir"):
        # Adapters run on the base's weights: the served LoRA version's own is taken out.
        return _("The endpoint's model was not fine-tuned with LoRA: it serves no adapters.")
    if version.runtime != served.runtime:
        return _("%(m)s runs on %(r)s; the endpoint's model on %(s)s.") % {
            "m": version,
            "r": version.runtime,
            "s": served.runtime,
        }
    (name, base_id), (served_name, served_id) = _base_of(version), _base_of(served)
    if not name or name in LLM_PRESETS:
        return _("%(m)s was trained from a preset, not an imported base model.") % {"m": version}
    same = base_id == served_id if base_id and served_id else name == served_name
    if not same:
        return _("%(m)s was fine-tuned from %(b)s; the endpoint's model from %(s)s.") % {
            "m": version,
            "b": name,
            "s": served_name or "–",
        }
    return None


def adapter_versions(endpoint: Endpoint) -> list[ModelVersion]:
    """The team's model versions that can be served as adapters of the endpoint's model (not
    the model itself, nor one already served as an adapter)."""
    served = endpoint.stable_revision.model_version if endpoint.stable_revision else None
    if served is None:
        return []
    versions = (
        ModelVersion.objects.filter(
            team=endpoint.team, runtime=served.runtime, task_kind__in=list(GENERATIVE_KINDS)
        )
        .exclude(pk=served.pk)
        .exclude(adapter_of__endpoint=endpoint)
        .select_related("job")
    )
    return [v for v in versions if adapter_problem(served, v) is None]


@transaction.atomic
def adapter_add(
    *,
    actor: AbstractBaseUser,
    endpoint: Endpoint,
    name: str,
    model_version: ModelVersion,
    rate_per_s: float | None = None,
) -> EndpointAdapter:
    """Serve ``model_version``'s adapter over the endpoint's model as ``<endpoint>/<name>``."""
    endpoint = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
    if model_version.team_id != endpoint.team_id:
        raise ValidationError(_("That model version belongs to another team."))
    if not NAME.fullmatch(name or ""):
        raise ValidationError(
            _(
                "An adapter name is 1 to 60 lower-case letters, digits, _ and -, the first a "
                "letter or a digit."
            )
        )
    if endpoint.adapters.filter(name=name).exists():
        raise ValidationError(_("The endpoint has an adapter named %(n)s.") % {"n": name})
    if endpoint.adapters.count() >= MAX_ADAPTERS:
        raise ValidationError(_("An endpoint serves at most %(n)d adapters.") % {"n": MAX_ADAPTERS})
    if rate_per_s is not None and not rate_per_s >= MIN_RATE_PER_S:
        raise ValidationError(
            _("A rate limit is at least %(n)s requests per second.") % {"n": MIN_RATE_PER_S}
        )
    served = endpoint.stable_revision.model_version if endpoint.stable_revision else None
    if served is None:
        raise ValidationError(_("The endpoint serves no model yet."))
    problem = adapter_problem(served, model_version)
    if problem:
        raise ValidationError(problem)
    adapter = EndpointAdapter.objects.create(
        endpoint=endpoint,
        name=name,
        model_version=model_version,
        rate_per_s=rate_per_s,
        created_by=actor,
    )
    audit_record(
        action="endpoint.adapter_add",
        actor=actor,
        team=endpoint.team,
        target=endpoint,
        data={"adapter": name, "model_version": str(model_version), "rate_per_s": rate_per_s},
    )
    converge_soon()
    return adapter


@transaction.atomic
def adapter_remove(*, actor: AbstractBaseUser, adapter: EndpointAdapter) -> None:
    endpoint = adapter.endpoint
    audit_record(
        action="endpoint.adapter_remove",
        actor=actor,
        team=endpoint.team,
        target=endpoint,
        data={"adapter": adapter.name, "model_version": str(adapter.model_version)},
    )
    adapter.delete()
    converge_soon()
