"""Console pages of training: jobs (submit, live progress, cancel, retry, clone), model
versions (evaluation report, comparison, download, import) and base models (import)."""

import heapq
import json
from urllib.parse import quote

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import NON_FIELD_ERRORS, PermissionDenied, ValidationError
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from console.forms import error_text
from console.hardware import profiles
from console.pagination import paginate, render_page
from console.permissions import team_view
from console.pickers import pick_response
from console.roles import Perm, Role, role_allows
from runtime.compress import MODES as QUANTIZATION_MODES
from runtime.estimate import estimates
from runtime.kinds import GENERATIVE_KINDS
from runtime.llm import TESTED as TESTED_ARCHITECTURES
from runtime.presets import LLM_PRESETS, PRESETS, presets_for
from training import api, selectors
from training.base_models import base_model_from_version, base_model_import
from training.compression import (
    DEFAULT_STUDENT,
    STUDENT_BACKEND,
    compression_submit,
    compression_view,
    deployment_figures,
    family_ids,
    student_base_models,
)
from training.edge import NEEDS as EDGE_RUNTIMES
from training.evaluations import evaluation_submit, leaderboard_table
from training.evaluations import leaderboard as evaluations_leaderboard
from training.forms import BaseModelImportForm, JobForm, ModelImportForm, SweepForm
from training.jobs import (
    job_plan,
    training_job_cancel,
    training_job_retry,
    training_job_submit,
)
from training.models import ModelEvaluation, ModelVersion, TrainingJob
from training.registry import model_version_delete, model_version_import, model_version_targets
from training.sweeps import param_importances, sweep_create, sweep_trials
from training.sweeps import sweep_cancel as sweep_cancel_service


def _can(request: HttpRequest, perm: Perm) -> bool:
    return role_allows(request.membership.role, perm)


def _top_priority(request: HttpRequest) -> bool:
    """The top priority is offered to the team's owners and site staff only."""
    return request.user.is_staff or request.membership.role == Role.OWNER


@team_view()
def jobs(request: HttpRequest) -> HttpResponse:
    jobs = selectors.team_jobs(request.team)
    if request.GET.get("version", "").isdigit():  # the jobs that trained on a dataset version
        jobs = jobs.filter(dataset_version_id=int(request.GET["version"]))
    return render_page(
        request, "training/jobs.html", jobs, {"can_write": _can(request, Perm.TRAINING_WRITE)}
    )


def _job_form_page(
    request: HttpRequest, initial: dict, origin: TrainingJob | None = None
) -> HttpResponse:
    """The new-job page (a clone of ``origin`` where given): the form, and the job it submits.
    Each change asks the page again for a preview (htmx): the form fitted to what the choices
    resolve to, its errors beside their fields, and how long the job may take."""
    form = JobForm(
        request.POST or None,
        team=request.team,
        base_models=selectors.team_base_models(request.team),
        initial=initial,
        top_priority=_top_priority(request),
    )
    if picked := pick_response(request, form):
        return picked
    preview = request.method == "POST" and request.GET.get("preview") == "1"
    if request.method == "POST" and form.is_valid() and not preview:
        try:
            job = training_job_submit(
                actor=request.user, team=request.team, origin=origin, **form.job_fields()
            )
        except (ValidationError, PermissionDenied) as exc:
            form.add_error(None, error_text(exc))
        else:
            return redirect("training:job", team=request.team.slug, training_job_id=job.pk)
    context = {"form": form, "origin": origin, **_job_guide(form, preview)}
    if preview:
        # What the page's script applies to the form as it stands (training/job_form.js):
        # the user's typing since the change is never replaced.
        context["guide"] = json.dumps(
            {
                "placeholders": {
                    name: field.widget.attrs.get("placeholder", "")
                    for name, field in form.fields.items()
                },
                "hidden": sorted(form.hidden),
                "errors": {name: [str(e) for e in errors] for name, errors in form.errors.items()},
            },
            ensure_ascii=False,
        )
        return render(request, "training/_job_guide.html", context)
    return render(request, "training/job_new.html", context)


def _job_guide(form: JobForm, preview: bool) -> dict:
    """The form fitted to the job its choices make (``JobForm.guide``) and the job's estimated
    duration; in a preview, errors only beside the fields the user has filled in."""
    if preview:
        form.is_valid()
        for name in list(form.errors):
            if name != NON_FIELD_ERRORS and form.data.get(name) in (None, ""):
                del form.errors[name]
    choices = form.plan_choices()
    if choices is None:
        return {}
    try:
        plan = job_plan(team=form.team, **choices)
    except ValidationError as exc:
        if preview:
            form.add_error("model", error_text(exc))
        return {}
    form.guide(plan)
    cleaned = getattr(form, "cleaned_data", {})
    epochs = cleaned.get("epochs") or plan.recommended["epochs"]
    rows = choices["dataset_version"].split_counts.get("train", 0)
    estimate = selectors.duration_estimate(
        preset=plan.preset,
        base_model_id=plan.model.pk if plan.model else None,
        device_type=choices["device_type"],
        rows=rows,
        epochs=epochs,
    )
    budget = cleaned.get("max_minutes") or plan.recommended["max_minutes"]
    if estimate and budget:
        estimate["seconds"] = min(estimate["seconds"], round(60 * budget))
    if estimate:
        estimate["duration"] = _duration_text(estimate["seconds"])
    return {
        "plan": plan,
        "estimate": estimate,
        "estimate_rows": rows,
        "estimate_epochs": epochs,
    }


def _duration_text(seconds: float) -> str:
    if seconds < 90:
        return _("%(n)d seconds") % {"n": round(seconds)}
    if seconds < 90 * 60:
        return _("%(n)d minutes") % {"n": round(seconds / 60)}
    return _("%(n).1f hours") % {"n": seconds / 3600}


@team_view(write=Perm.TRAINING_WRITE)
def job_new(request: HttpRequest) -> HttpResponse:
    # No model given: the form chooses the team's own encoder where it has one, else the default.
    initial = {}
    if request.GET.get("version"):
        initial["dataset_version"] = request.GET["version"]
    return _job_form_page(request, initial)


@team_view()
def job(request: HttpRequest, training_job_id: int) -> HttpResponse:
    job = selectors.job_get(request.team, training_job_id)
    return render(
        request,
        "training/job.html",
        {
            "job": job,
            "log": selectors.job_log_tail(job),
            "status_labels": json.dumps({k: str(v) for k, v in TrainingJob.Status.choices}),
            "can_write": _can(request, Perm.TRAINING_WRITE),
        },
    )


@team_view()
def job_log(request: HttpRequest, training_job_id: int) -> HttpResponse:
    """The job's whole log as a text file: every attempt's lines, the frameworks' warnings
    that the page's panel leaves out with them."""
    job = selectors.job_get(request.team, training_job_id)

    def lines():
        for event in selectors.job_log(job):
            when = timezone.localtime(event.created_at).strftime("%Y-%m-%d %H:%M:%S")
            if event.kind == "resumed":
                text = f"— resumed from step {event.data.get('step')} —"
            else:
                text = str(event.data.get("message", ""))
            yield f"{when} [{event.attempt}] {text}\n"

    response = StreamingHttpResponse(lines(), content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}-log.txt"'
    return response


def _job_action(
    request: HttpRequest, training_job_id: int, action, done: str, **kwargs
) -> HttpResponse:
    job = selectors.job_get(request.team, training_job_id)
    try:
        result = action(actor=request.user, job=job, **kwargs)
    except (ValidationError, PermissionDenied) as exc:
        messages.error(request, error_text(exc))
        return redirect("training:job", team=request.team.slug, training_job_id=job.pk)
    messages.success(request, done)
    return redirect("training:job", team=request.team.slug, training_job_id=result.pk)


@team_view(write=Perm.TRAINING_WRITE)
@require_POST
def job_cancel(request: HttpRequest, training_job_id: int) -> HttpResponse:
    return _job_action(request, training_job_id, training_job_cancel, _("The job is cancelled."))


@team_view(write=Perm.TRAINING_WRITE)
@require_POST
def job_retry(request: HttpRequest, training_job_id: int) -> HttpResponse:
    return _job_action(
        request, training_job_id, training_job_retry, _("A new job retries this one.")
    )


@team_view(write=Perm.TRAINING_WRITE)
def job_clone(request: HttpRequest, training_job_id: int) -> HttpResponse:
    """The new-job form, filled in with this job's spec, to change and submit."""
    source = selectors.job_get(request.team, training_job_id)
    initial = {
        "dataset_version": source.dataset_version_id,
        "backend": source.backend,
        "model": f"base:{source.base_model.name}"
        if source.base_model_id
        else f"preset:{source.preset}",
        "objective": source.objective,
        "device_type": source.device_type,
        "device_count": source.device_count,
        "priority": source.priority,
        "max_hours": source.max_hours,
        "name": f"{source.name} (clone)",
        **source.hyperparameters,
    }
    return _job_form_page(request, initial, origin=source)


@team_view(write=Perm.TRAINING_WRITE)
def models(request: HttpRequest) -> HttpResponse:
    versions = selectors.team_model_versions(request.team)
    # Lineage backwards: the models of a dataset, or of one of its versions.
    dataset, data_version = request.GET.get("dataset", ""), request.GET.get("version", "")
    if dataset.isdigit():
        versions = versions.filter(dataset_version__dataset_id=int(dataset))
    if data_version.isdigit():
        versions = versions.filter(dataset_version_id=int(data_version))
    form = ModelImportForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        try:
            version = model_version_import(
                actor=request.user, team=request.team, archive=form.cleaned_data["archive"]
            )
        except ValidationError as exc:
            form.add_error(None, error_text(exc))
        else:
            return redirect("training:model", team=request.team.slug, model_version_id=version.pk)
    return render_page(
        request,
        "training/models.html",
        versions,
        {"form": form, "can_write": _can(request, Perm.TRAINING_WRITE)},
    )


# A confusion matrix is drawn up to this many labels (a readable page, and a bounded one: a
# version may have 2,000 labels, 4 million cells); past it the page lists the most frequent
# confusions (``confusions``).
MAX_HEATMAP_LABELS = 30
MAX_CONFUSIONS = 20


def heatmap(confusion: dict) -> list[dict]:
    """Rows of the confusion matrix with each cell's share of its row, for shading; none past
    ``MAX_HEATMAP_LABELS``."""
    if len(confusion.get("labels", [])) > MAX_HEATMAP_LABELS:
        return []
    rows = []
    for label, counts in zip(
        confusion.get("labels", []), confusion.get("matrix", []), strict=False
    ):
        total = sum(counts) or 1
        rows.append(
            {
                "label": label,
                "cells": [{"n": n, "alpha": round(n / total, 3)} for n in counts],
                "total": sum(counts),
            }
        )
    return rows


def confusions(confusion: dict) -> list[dict]:
    """The most frequent confusions (true label, predicted label, rows, share of the true
    label's rows), largest first, where the matrix is too large to draw."""
    labels, matrix = confusion.get("labels", []), confusion.get("matrix", [])
    if len(labels) <= MAX_HEATMAP_LABELS:
        return []
    rows = matrix[: len(labels)]
    totals = [sum(counts) for counts in rows]
    cells = (
        (n, i, j)
        for i, counts in enumerate(rows)
        for j, n in enumerate(counts[: len(labels)])
        if n and i != j
    )
    return [
        {"true": labels[i], "predicted": labels[j], "n": n, "share": n / totals[i]}
        for n, i, j in heapq.nlargest(MAX_CONFUSIONS, cells, key=lambda cell: cell[0])
    ]


def _answer(item: dict) -> str:
    if "entities" in item:
        return (
            ", ".join(
                f"{e.get('text', '')}[{e['start']}:{e['end']}] {e['label']}"
                for e in item["entities"]
            )
            or "∅"
        )
    if "labels" in item:
        return ", ".join(item["labels"]) or "∅"
    return str(item.get("label", ""))


def mistakes(evaluation: dict, limit: int = 20) -> list[dict]:
    """The first wrong predictions of the test split, as text, true and predicted answers."""
    rows = []
    for m in evaluation.get("mistakes", [])[:limit]:
        row = m["row"]
        text = row.get("text") or f"{row.get('text_a', '')} ‖ {row.get('text_b', '')}"
        rows.append({"text": text, "true": _answer(row), "predicted": _answer(m["predicted"])})
    return rows


@team_view(write=Perm.TRAINING_WRITE)
def model(request: HttpRequest, model_version_id: int) -> HttpResponse:
    version = selectors.model_version_get(request.team, model_version_id)
    if request.method == "POST" and request.POST.get("action") == "delete":
        try:
            model_version_delete(actor=request.user, version=version)
        except ValidationError as exc:
            messages.error(request, error_text(exc))
        else:
            messages.success(request, _("The model version is deleted."))
            return redirect("training:models", team=request.team.slug)
    if request.method == "POST" and request.POST.get("action") == "base_model":
        if not _can(request, Perm.MODEL_IMPORT):
            raise PermissionDenied
        try:
            model = base_model_from_version(
                actor=request.user, version=version, name=request.POST.get("name", "")
            )
        except ValidationError as exc:
            messages.error(request, error_text(exc))
        else:
            messages.success(request, _("%(name)s is a base model now.") % {"name": model.name})
            return redirect("training:base_models", team=request.team.slug)
    if request.method == "POST" and request.POST.get("action") == "evaluate":
        if not _can(request, Perm.TRAINING_WRITE):
            raise PermissionDenied
        try:
            job = evaluation_submit(
                actor=request.user,
                team=request.team,
                model_version=version,
                dataset_version=selectors.evaluation_set_get(
                    request.team, request.POST.get("evaluation_set", "")
                ),
                max_new_tokens=_int_field(request.POST.get("max_new_tokens"), 64, _("New tokens")),
            )
        except ValidationError as exc:
            messages.error(request, error_text(exc))
        else:
            messages.success(
                request, _("The evaluation is queued as job #%(id)d.") % {"id": job.pk}
            )
            return redirect("training:job", team=request.team.slug, training_job_id=job.pk)
    if request.method == "POST" and request.POST.get("action") == "compress":
        if not _can(request, Perm.TRAINING_WRITE):
            raise PermissionDenied
        try:
            job = compression_submit(
                actor=request.user,
                version=version,
                method=request.POST.get("method", "int8"),
                student=request.POST.get("student", ""),
                mode=request.POST.get("mode", "dynamic"),
                calibration_rows=_int_field(
                    request.POST.get("calibration_rows"), 200, _("Calibration rows")
                ),
                hyperparameters=_student_hyperparameters(request),
            )
        except ValidationError as exc:
            messages.error(request, error_text(exc))
        else:
            messages.success(
                request, _("The compression is queued as job #%(id)d.") % {"id": job.pk}
            )
            return redirect("training:job", team=request.team.slug, training_job_id=job.pk)
    metrics = version.evaluation.get("metrics", {})
    return render(
        request,
        "training/model.html",
        {
            "version": version,
            "metrics": metrics,
            "heatmap": heatmap(metrics.get("confusion", {})),
            "confusions": confusions(metrics.get("confusion", {})),
            "comparison": version.baseline_comparison,
            "mistakes": mistakes(version.evaluation),
            "can_write": _can(request, Perm.TRAINING_WRITE),
            "can_deploy": _can(request, Perm.DEPLOYMENT_WRITE),
            "can_import": _can(request, Perm.MODEL_IMPORT),
            "generative": version.task_kind in GENERATIVE_KINDS,
            "targets": model_version_targets(version),
            "edge_runtimes": list(EDGE_RUNTIMES),
            "compression": compression_view(version),
            "family": family_ids(version),
            "quantization_modes": QUANTIZATION_MODES,
            "students": presets_for(version.task_kind, STUDENT_BACKEND),
            "student_bases": [m.name for m in student_base_models(request.team)],
            "default_student": DEFAULT_STUDENT,
            "evaluation_sets": selectors.team_evaluation_sets(request.team)[:100]
            if version.task_kind in GENERATIVE_KINDS
            else [],
            "model_evaluations": selectors.version_evaluations(version)[:50],
        },
    )


@team_view()
def evaluation_sets(request: HttpRequest) -> HttpResponse:
    """The team's evaluation sets, each with how many model versions were scored on it."""
    sets = selectors.team_evaluation_sets(request.team).annotate(
        scored=Count(
            "model_evaluations__model_version",
            distinct=True,
            filter=Q(model_evaluations__status=ModelEvaluation.Status.DONE),
        )
    )
    page, query = paginate(request, sets)
    return render(request, "training/evaluation_sets.html", {"page": page, "query": query})


@team_view()
def leaderboard(request: HttpRequest, dataset_version_id: int) -> HttpResponse:
    """Every model version scored on an evaluation set, best first, side by side; as CSV with
    ``?format=csv``."""
    evaluation_set = selectors.evaluation_set_get(request.team, dataset_version_id)
    board = evaluations_leaderboard(evaluation_set)
    if request.GET.get("format") == "csv":
        import csv

        response = HttpResponse(content_type="text/csv; charset=utf-8")
        name = f"leaderboard-{evaluation_set.dataset.name}-v{evaluation_set.number}.csv"
        response["Content-Disposition"] = f"attachment; filename*=UTF-8''{quote(name)}"
        response.write("\ufeff")  # Excel reads the Chinese right
        csv.writer(response).writerows(leaderboard_table(board))
        return response
    return render(
        request,
        "training/leaderboard.html",
        {"evaluation_set": evaluation_set, "board": board},
    )


@team_view()
def model_evaluation(request: HttpRequest, evaluation_id: int) -> HttpResponse:
    evaluation = selectors.model_evaluation_get(request.team, evaluation_id)
    return render(request, "training/model_evaluation.html", {"evaluation": evaluation})


@team_view()
def model_download(request: HttpRequest, model_version_id: int) -> HttpResponse:
    version = selectors.model_version_get(request.team, model_version_id)
    edge = request.GET.get("bundle") == "edge"
    return api.model_archive_response(version, request.GET.get("target"), edge)


@team_view()
def models_compare(request: HttpRequest) -> HttpResponse:
    given = request.GET.getlist("ids")
    ids = list(dict.fromkeys(int(i) for i in given if i.isdigit() and len(i) <= 18))
    if len(ids) > MAX_COMPARED:
        messages.warning(
            request,
            _("At most %(n)d versions are compared: the first %(n)d are shown.")
            % {"n": MAX_COMPARED},
        )
        ids = ids[:MAX_COMPARED]
    versions = selectors.model_versions_get(request.team, ids) if ids else []
    keys = sorted({k for v in versions for k in v.metrics if k != "support"})
    hp_keys = sorted({k for v in versions for k in v.hyperparameters})

    def f1s(v: ModelVersion) -> dict:
        per_label = ((v.evaluation or {}).get("metrics") or {}).get("per_label")
        return per_label if isinstance(per_label, dict) else {}

    labels = list(dict.fromkeys(label for v in versions for label in f1s(v)))
    hp_rows = [(k, [v.hyperparameters.get(k) for v in versions]) for k in hp_keys]
    return render(
        request,
        "training/compare.html",
        {
            "versions": versions,
            "deployment": list(zip(versions, deployment_figures(versions), strict=True)),
            "metric_rows": [(k, [v.metrics.get(k) for v in versions]) for k in keys],
            "label_rows": [(label, [_f1(f1s(v).get(label)) for v in versions]) for label in labels],
            # The hyperparameters that differ: the same value everywhere tells nothing apart.
            "hp_rows": [row for row in hp_rows if len(versions) < 2 or _differ(row[1])],
            "hp_same": sum(not _differ(values) for _k, values in hp_rows)
            if len(versions) > 1
            else 0,
        },
    )


MAX_COMPARED = 12  # versions side by side: a readable page, and a bounded one
MAX_CURVES = 5  # jobs whose curves one chart overlays (a colour each)
CURVE_POINTS = 400  # a loss curve's points at most, evenly thinned


def _differ(values: list) -> bool:
    return len({json.dumps(x, sort_keys=True, default=str) for x in values}) > 1


def _student_hyperparameters(request: HttpRequest) -> dict | None:
    """The compress form's student epochs, for a distillation (blank: the recommended)."""
    if request.POST.get("method") != "distill" or not request.POST.get("epochs"):
        return None
    return {"epochs": _int_field(request.POST.get("epochs"), 0, _("Student epochs"))}


def _f1(entry) -> float | None:
    f1 = entry.get("f1") if isinstance(entry, dict) else None
    return f1 if isinstance(f1, int | float) else None


def _int_field(value: str | None, default: int, field: str) -> int:
    """A whole number a form posted (``default`` when it is empty); the service checks the
    range."""
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValidationError(
            _("%(field)s must be a whole number, not “%(value)s”.")
            % {"field": field, "value": value[:50]}
        ) from None


def _int_param(request: HttpRequest, name: str, default: int, low: int, high: int) -> int:
    try:
        return min(max(int(request.GET.get(name, default)), low), high)
    except ValueError:
        return default


@team_view(write=Perm.MODEL_IMPORT)
def base_models(request: HttpRequest) -> HttpResponse:
    form = BaseModelImportForm(
        request.POST or None, request.FILES or None, can_share=request.user.is_staff
    )
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            model = base_model_import(
                actor=request.user,
                team=request.team,
                name=data["name"],
                backend=data["backend"],
                path=data["path"],
                archive=data["archive"],
                shared=data.get("shared", False),
            )
        except (ValidationError, PermissionDenied) as exc:
            form.add_error(None, error_text(exc))
        else:
            messages.success(request, _("Imported %(name)s.") % {"name": model.name})
            return redirect("training:base_models", team=request.team.slug)
    # The memory estimate of fine-tuning each causal LM, at the batch size and length asked.
    batch_size = _int_param(request, "batch_size", 4, 1, 1024)
    seq_length = _int_param(request, "seq_length", 1024, 8, 131072)
    page, query = paginate(request, selectors.team_base_models(request.team))
    for m in page:
        if m.summary.get("causal_lm"):
            m.tested = m.backend in TESTED_ARCHITECTURES.get(m.architecture, ())
            m.estimates = estimates(
                m.summary, profiles().values(), batch_size=batch_size, seq_length=seq_length
            )
    return render(
        request,
        "training/base_models.html",
        {
            "page": page,
            "query": query,
            "batch_size": batch_size,
            "seq_length": seq_length,
            "form": form,
            "import_dir": settings.MODEL_IMPORT_DIR,
            "presets": PRESETS,
            "llm_presets": LLM_PRESETS,
            "tested_architectures": TESTED_ARCHITECTURES,
            "can_write": _can(request, Perm.MODEL_IMPORT),
        },
    )


@team_view()
def sweeps(request: HttpRequest) -> HttpResponse:
    return render_page(
        request,
        "training/sweeps.html",
        selectors.team_sweeps(request.team),
        {"can_write": _can(request, Perm.TRAINING_WRITE)},
    )


@team_view(write=Perm.TRAINING_WRITE)
def sweep_new(request: HttpRequest) -> HttpResponse:
    initial = {"model": "preset:"}
    if request.GET.get("version"):
        initial["dataset_version"] = request.GET["version"]
    form = SweepForm(
        request.POST or None,
        team=request.team,
        base_models=selectors.team_base_models(request.team),
        initial=initial,
    )
    if picked := pick_response(request, form):
        return picked
    if request.method == "POST" and form.is_valid():
        try:
            sweep = sweep_create(actor=request.user, team=request.team, **form.sweep_fields())
        except (ValidationError, PermissionDenied) as exc:
            form.add_error(None, error_text(exc))
        else:
            return redirect("training:sweep", team=request.team.slug, sweep_id=sweep.pk)
    return render(request, "training/sweep_new.html", {"form": form})


@team_view()
def sweep(request: HttpRequest, sweep_id: int) -> HttpResponse:
    sweep = selectors.sweep_get(request.team, sweep_id)
    importances = param_importances(sweep, list(sweep.trials.all()))
    return render(
        request,
        "training/sweep.html",
        {
            "sweep": sweep,
            "trials": sweep_trials(sweep),
            "importances": [
                {"name": k, "value": v, "percent": round(100 * v, 1)}
                for k, v in sorted(importances.items(), key=lambda kv: -kv[1])
            ],
            "can_write": _can(request, Perm.TRAINING_WRITE),
        },
    )


@team_view(write=Perm.TRAINING_WRITE)
@require_POST
def sweep_cancel(request: HttpRequest, sweep_id: int) -> HttpResponse:
    sweep = selectors.sweep_get(request.team, sweep_id)
    try:
        sweep_cancel_service(actor=request.user, sweep=sweep)
    except ValidationError as exc:
        messages.error(request, error_text(exc))
    else:
        messages.success(request, _("The hyperparameter search is cancelled."))
    return redirect("training:sweep", team=request.team.slug, sweep_id=sweep.pk)


@team_view()
def jobs_compare(request: HttpRequest) -> HttpResponse:
    """The curves of several jobs on one chart each: the training loss (smoothed as on a job's
    page) and every dev metric per evaluation."""
    given = request.GET.getlist("ids")
    ids = list(dict.fromkeys(int(i) for i in given if i.isdigit() and len(i) <= 18))
    if len(ids) > MAX_CURVES:
        messages.warning(
            request,
            _("At most %(n)d jobs are compared: the first %(n)d are shown.") % {"n": MAX_CURVES},
        )
        ids = ids[:MAX_CURVES]
    found = {j.pk: j for j in selectors.team_jobs(request.team).filter(pk__in=ids)}
    jobs = [found[i] for i in ids if i in found]
    curves = selectors.job_curves(jobs, CURVE_POINTS)
    series = [
        {"id": job.pk, "name": job.name, "loss": curves[job.pk][0], "dev": curves[job.pk][1]}
        for job in jobs
    ]
    metrics = sorted({name for s in series for name in s["dev"]})
    return render(
        request,
        "training/jobs_compare.html",
        {
            "jobs": jobs,
            "series": series,
            "metrics": metrics,
            "metric": next((m for m in ("macro_f1", "f1", "micro_f1") if m in metrics), None)
            or (metrics[0] if metrics else ""),
        },
    )
