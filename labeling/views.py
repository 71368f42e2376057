"""Console pages of datasets: list, detail with upload, column mapping, import progress,
versions with statistics, rows, report, downloads, compare, merge."""

import itertools

import httpx
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.utils.translation import ngettext
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

import labeling.datasets
from console.forms import error_text
from console.pagination import render_page
from console.permissions import team_view
from console.quotas import team_storage_quota, team_storage_used
from console.roles import Perm, role_allows
from labeling import exports, label_studio, selectors, task_kinds
from labeling.forms import (
    DatasetForm,
    ExportForm,
    ImportForm,
    LabelingProjectForm,
    split_labels,
)
from labeling.imports import import_start, version_merge
from labeling.models import ImportJob
from labeling.pipeline import LENGTH_BINS, SPLIT_LABELS, SPLITS
from labeling.projects import (
    WEBHOOK_SECRET_HEADER,
    labeling_project_create,
    labeling_project_set_labels,
    webhook_project,
)
from labeling.sync import labeling_project_sync_request


def _can_write(request: HttpRequest) -> bool:
    return role_allows(request.membership.role, Perm.DATASET_WRITE)


def bars(counts: dict[str, int], limit: int = 30) -> list[dict]:
    """Rows of a horizontal bar chart: label, count, width in percent of the largest."""
    items = list(counts.items())[:limit]
    top = max((c for _, c in items), default=0) or 1
    return [{"label": k, "count": c, "pct": round(100 * c / top, 1)} for k, c in items]


def length_bars(stats: dict) -> dict[str, int]:
    edges = stats.get("length_bins", list(LENGTH_BINS))
    hist = stats.get("length_hist", [])
    labels = [f"{lo}–{hi - 1}" for lo, hi in itertools.pairwise(edges)] + [f"≥{edges[-1]}"]
    counts = dict(zip(labels, hist, strict=False))
    while len(counts) > 1 and not counts[next(reversed(counts))]:
        counts.popitem()  # no empty bins above the longest text
    return counts


@team_view(write=Perm.DATASET_WRITE)
def datasets(request: HttpRequest) -> HttpResponse:
    form = DatasetForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            dataset = labeling.datasets.dataset_create(
                actor=request.user, team=request.team, **form.cleaned_data
            )
        except ValidationError as exc:
            form.add_error(None, error_text(exc))
        else:
            return redirect("labeling:dataset", team=request.team.slug, dataset_id=dataset.pk)
    return render_page(
        request,
        "labeling/datasets.html",
        selectors.team_datasets_overview(request.team),
        {
            "form": form,
            "can_write": _can_write(request),
            "storage": {
                "used": team_storage_used(request.team),
                "quota": team_storage_quota(request.team),
            },
        },
    )


@team_view(write=Perm.DATASET_WRITE)
def dataset(request: HttpRequest, dataset_id: int) -> HttpResponse:
    ds = selectors.dataset_get(request.team, dataset_id)
    return render_page(
        request,
        "labeling/dataset.html",
        ds.versions.select_related("created_by", "parent"),
        {
            "dataset": ds,
            "imports": ds.imports.select_related("version", "identical_to", "upload")[:10],
            "can_write": _can_write(request),
            "chunk_size": settings.UPLOAD_CHUNK_BYTES,
            "max_mb": settings.UPLOAD_MAX_BYTES // 2**20,
        },
    )


@team_view(write=Perm.DATASET_WRITE)
@require_POST
def dataset_delete(request: HttpRequest, dataset_id: int) -> HttpResponse:
    ds = selectors.dataset_get(request.team, dataset_id)
    try:
        labeling.datasets.dataset_delete(actor=request.user, dataset=ds)
    except ValidationError as exc:
        messages.error(request, error_text(exc))
        return redirect("labeling:dataset", team=request.team.slug, dataset_id=ds.pk)
    messages.success(request, _("Dataset “%(name)s” deleted.") % {"name": ds.name})
    return redirect("labeling:datasets", team=request.team.slug)


@team_view(read=Perm.DATASET_WRITE, write=Perm.DATASET_WRITE)
def import_mapping(request: HttpRequest, dataset_id: int, upload_id) -> HttpResponse:
    """Check what the platform made of the file, map its columns, choose the options."""
    ds = selectors.dataset_get(request.team, dataset_id)
    upload = selectors.upload_get(request.team, upload_id)
    if upload.status != upload.Status.COMPLETE:
        raise Http404("The upload is not complete.")
    source = request.POST if request.method == "POST" else request.GET
    preview = selectors.upload_preview(
        upload, ds.task_kind, source.get("format") or None, source.get("encoding") or None
    )
    initial = {"format": preview.format, "encoding": preview.encoding}
    initial.update({f"map_{k}": v for k, v in preview.mapping.items()})
    form = ImportForm(
        request.POST if request.method == "POST" and "start" in request.POST else None,
        kind=ds.task_kind,
        columns=preview.columns,
        initial=initial,
    )
    if form.is_bound and form.is_valid():
        try:
            job = import_start(
                actor=request.user,
                dataset=ds,
                upload=upload,
                fmt=form.cleaned_data["format"],
                encoding=form.cleaned_data["encoding"] or None,
                options=form.import_options(),
            )
        except ValidationError as exc:
            form.add_error(None, error_text(exc))
        else:
            return redirect("labeling:import_job", team=request.team.slug, job_id=job.pk)
    return render(
        request,
        "labeling/import_mapping.html",
        {"dataset": ds, "upload": upload, "preview": preview, "form": form},
    )


@team_view()
def import_job(request: HttpRequest, job_id: int) -> HttpResponse:
    job = selectors.import_job_get(request.team, job_id)
    template = "labeling/_import_status.html" if request.htmx else "labeling/import_job.html"
    report = selectors.report_entries(job.report_file, per_page=20) if job.report_file else None
    return render(request, template, {"job": job, "report": report, "Status": ImportJob.Status})


@team_view()
def version(request: HttpRequest, dataset_id: int, number: int) -> HttpResponse:
    ds = selectors.dataset_get(request.team, dataset_id)
    v = selectors.version_get(ds, number)
    stats = v.stats
    return render(
        request,
        "labeling/version.html",
        {
            "dataset": ds,
            "version": v,
            "label_bars": bars(stats.get("labels", {})),
            "length_bars": bars(length_bars(stats), limit=100),
            "entity_bars": bars(stats.get("entities", {})),
            "split_rows": [(SPLIT_LABELS[s], v.split_counts.get(s, 0)) for s in SPLITS],
            "reasons": sorted(v.errors_by_reason.items(), key=lambda kv: -kv[1]),
            "other_versions": ds.versions.exclude(pk=v.pk),
            "can_train": role_allows(request.membership.role, Perm.TRAINING_WRITE),
        },
    )


def _int(value, default: int = 1) -> int:
    try:
        return max(int(value), 1)
    except (TypeError, ValueError):
        return default


@team_view()
def version_rows(request: HttpRequest, dataset_id: int, number: int) -> HttpResponse:
    ds = selectors.dataset_get(request.team, dataset_id)
    v = selectors.version_get(ds, number)
    filters = {k: request.GET.get(k, "").strip() for k in ("q", "label", "split")}
    page = selectors.version_rows(v, page=_int(request.GET.get("page")), **filters)
    query = request.GET.copy()
    query.pop("page", None)
    return render(
        request,
        "labeling/version_rows.html",
        {
            "dataset": ds,
            "version": v,
            "page": page,
            "filters": filters,
            "query": query.urlencode(),
            "labels": list(v.stats.get("labels", {})),
            "splits": SPLIT_LABELS,
            "fields": task_kinds.get(ds.task_kind).row_fields(),
        },
    )


@team_view()
def version_report(request: HttpRequest, dataset_id: int, number: int) -> HttpResponse:
    ds = selectors.dataset_get(request.team, dataset_id)
    v = selectors.version_get(ds, number)
    reason = request.GET.get("reason", "")
    page = selectors.report_entries(
        v.report_file, page=_int(request.GET.get("page")), reason=reason
    )
    return render(
        request,
        "labeling/version_report.html",
        {
            "dataset": ds,
            "version": v,
            "page": page,
            "reason": reason,
            "reasons": sorted(v.errors_by_reason),
        },
    )


@team_view()
def version_download(request: HttpRequest, dataset_id: int, number: int, kind: str) -> HttpResponse:
    ds = selectors.dataset_get(request.team, dataset_id)
    try:
        return exports.download_response(selectors.version_get(ds, number), kind)
    except ValidationError as exc:
        messages.error(request, error_text(exc))
        return redirect("labeling:version", team=request.team.slug, dataset_id=ds.pk, number=number)


@team_view()
def compare(request: HttpRequest, dataset_id: int) -> HttpResponse:
    ds = selectors.dataset_get(request.team, dataset_id)
    a, b = _int(request.GET.get("a"), 0), _int(request.GET.get("b"), 0)
    old, new = selectors.version_get(ds, a), selectors.version_get(ds, b)
    return render(
        request,
        "labeling/compare.html",
        {"dataset": ds, "old": old, "new": new, "diff": selectors.version_compare(old, new)},
    )


@team_view(write=Perm.DATASET_WRITE)
@require_POST
def merge(request: HttpRequest, dataset_id: int) -> HttpResponse:
    ds = selectors.dataset_get(request.team, dataset_id)
    numbers = [_int(n, 0) for n in request.POST.getlist("versions")]
    versions = selectors.versions_get(ds, numbers)
    try:
        job = version_merge(actor=request.user, dataset=ds, versions=versions, options={})
    except ValidationError as exc:
        messages.error(request, error_text(exc))
        return redirect("labeling:dataset", team=request.team.slug, dataset_id=ds.pk)
    return redirect("labeling:import_job", team=request.team.slug, job_id=job.pk)


@team_view(read=Perm.ANNOTATE)
def project_open(request: HttpRequest, project_id: int) -> HttpResponse:
    """Into Label Studio's labeling page, logged in as the user's own Label Studio account:
    the user never handles a Label Studio password or token."""
    p = selectors.labeling_project_get(request.team, project_id)
    if p.ls_project_id is None:
        raise Http404("The project is not in Label Studio yet.")
    try:
        session = label_studio.login_session(request.user, request.team)
    except label_studio.TooManySwitches as exc:
        minutes = -(-exc.retry_after // 60)
        messages.error(
            request,
            ngettext(
                "You changed the team you label in too often this hour: "
                "labeling in this team opens again in %(minutes)d minute.",
                "You changed the team you label in too often this hour: "
                "labeling in this team opens again in %(minutes)d minutes.",
                minutes,
            )
            % {"minutes": minutes},
        )
        return redirect("labeling:project", team=request.team.slug, project_id=p.pk)
    except (label_studio.NotConfigured, httpx.HTTPError) as exc:
        messages.error(request, _("Label Studio is not reachable: %(error)s") % {"error": exc})
        return redirect("labeling:project", team=request.team.slug, project_id=p.pk)
    response = redirect(f"{settings.LABEL_STUDIO_URL}/projects/{p.ls_project_id}/data?labeling=1")
    # Cookies ignore ports: set on the host that serves both, Label Studio's session reaches it.
    response.set_cookie(label_studio.SESSION_COOKIE, session, httponly=True, samesite="Lax")
    return response


@csrf_exempt  # called by Label Studio, authenticated by the secret in a header
@require_POST
def label_studio_webhook(request: HttpRequest, project_id: int) -> HttpResponse:
    secret = request.headers.get(WEBHOOK_SECRET_HEADER, "")
    project = webhook_project(project_id, secret)
    if project is None:
        raise Http404
    labeling_project_sync_request(project)
    return JsonResponse({"queued": True}, status=202)


@team_view()
def projects(request: HttpRequest) -> HttpResponse:
    return render_page(
        request, "labeling/projects.html", selectors.team_labeling_projects(request.team)
    )


@team_view(write=Perm.LABELING_MANAGE)
def project_create(request: HttpRequest, dataset_id: int, number: int) -> HttpResponse:
    ds = selectors.dataset_get(request.team, dataset_id)
    v = selectors.version_get(ds, number)
    form = LabelingProjectForm(request.POST or None, initial={"labels": ", ".join(ds.labels)})
    if request.method == "POST" and form.is_valid():
        try:
            project = labeling_project_create(actor=request.user, version=v, **form.cleaned_data)
        except ValidationError as exc:
            form.add_error(None, error_text(exc))
        else:
            return redirect("labeling:project", team=request.team.slug, project_id=project.pk)
    return render(
        request, "labeling/project_create.html", {"dataset": ds, "version": v, "form": form}
    )


@team_view(read=Perm.TEAM_VIEW, write=Perm.LABELING_MANAGE)
def project(request: HttpRequest, project_id: int) -> HttpResponse:
    p = selectors.labeling_project_get(request.team, project_id)
    if request.method == "POST" and "labels" in request.POST:
        try:
            labeling_project_set_labels(
                actor=request.user, project=p, labels=split_labels(request.POST["labels"])
            )
            messages.success(request, _("Labels changed."))
        except ValidationError as exc:
            messages.error(request, error_text(exc))
        return redirect("labeling:project", team=request.team.slug, project_id=p.pk)
    form = ExportForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            job = exports.labeling_project_export(
                actor=request.user, project=p, **form.cleaned_data
            )
        except ValidationError as exc:
            form.add_error(None, error_text(exc))
        else:
            return redirect("labeling:import_job", team=request.team.slug, job_id=job.pk)
    template = "labeling/_project_status.html" if request.htmx else "labeling/project.html"
    return render(
        request,
        template,
        {
            "project": p,
            "progress": selectors.labeling_project_progress(p),
            "agreement": selectors.labeling_project_agreement(p) if p.overlap > 1 else None,
            "invalid": p.annotations.filter(valid=False).select_related("task")[:50],
            "rejected": selectors.labeling_project_rejected(p),
            "ls_url": f"{settings.LABEL_STUDIO_URL}/projects/{p.ls_project_id}/data"
            if p.ls_project_id
            else "",
            "export_form": form,
            "can_manage": role_allows(request.membership.role, Perm.LABELING_MANAGE),
        },
    )
