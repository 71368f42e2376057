"""Console pages of deployment: endpoints (deploy, state, charts, try-it, keys, canary,
promote, roll back) and the pre-annotation of a labeling project by an endpoint."""

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import add_never_cache_headers
from django.utils.translation import gettext as _
from django.views.decorators.http import require_http_methods, require_POST

from console.forms import error_text
from console.pagination import paginate
from console.permissions import team_view
from console.pickers import pick_response
from console.roles import Perm, role_allows
from deployment import rollout, selectors
from deployment.adapters import adapter_add, adapter_remove, adapter_versions
from deployment.evaluations import endpoint_evaluation_start
from deployment.forms import (
    AdapterForm,
    CanaryForm,
    DeployForm,
    EndpointEvaluateForm,
    JudgeForm,
    KeyForm,
    PreannotateForm,
)
from deployment.judge import DEFAULT_RUBRIC, judge_endpoints, judge_start
from deployment.keys import endpoint_key_create, endpoint_key_revoke
from deployment.preannotate import preannotate_start
from deployment.quality import compare_with_serving
from labeling.selectors import labeling_project_get
from runtime.kinds import GENERATIVE_KINDS
from training.selectors import model_evaluation_get, team_evaluation_sets


def _endpoint_page(request: HttpRequest, endpoint) -> HttpResponse:
    return redirect("deployment:endpoint", team=request.team.slug, endpoint_id=endpoint.pk)


def _form_refused(request: HttpRequest, endpoint, form) -> HttpResponse:
    """A form of the endpoint page that did not validate: its errors as a message."""
    messages.error(request, " ".join(e for errs in form.errors.values() for e in errs))
    return _endpoint_page(request, endpoint)


@team_view()
def endpoints(request: HttpRequest) -> HttpResponse:
    page, query = paginate(request, selectors.team_endpoints_overview(request.team))
    rows = []
    for endpoint in page:
        state = selectors.endpoint_state(endpoint, endpoint.active_revisions)
        rows.append((endpoint, state, selectors.ENDPOINT_STATES[state]))
    return render(
        request,
        "deployment/endpoints.html",
        {
            "rows": rows,
            "page": page,
            "query": query,
            "hosts": selectors.serving_hosts(),
            "can_write": role_allows(request.membership.role, Perm.DEPLOYMENT_WRITE),
        },
    )


@team_view(write=Perm.DEPLOYMENT_WRITE)
def endpoint_new(request: HttpRequest) -> HttpResponse:
    initial = {}
    if request.GET.get("version", "").isdigit():
        initial["model_version"] = int(request.GET["version"])
    form = DeployForm(request.POST or None, team=request.team, initial=initial)
    if picked := pick_response(request, form):
        return picked
    if request.method == "POST" and form.is_valid():
        try:
            endpoint = rollout.endpoint_deploy(
                actor=request.user, team=request.team, **form.cleaned_data
            )
        except ValidationError as exc:
            form.add_error(None, error_text(exc))
        else:
            messages.success(request, _("Deployed. The endpoint takes traffic once it is ready."))
            return _endpoint_page(request, endpoint)
    return render(request, "deployment/endpoint_new.html", {"form": form})


@team_view()
def endpoint(request: HttpRequest, endpoint_id: int) -> HttpResponse:
    endpoint = selectors.endpoint_get(request.team, endpoint_id)
    if "pick" in request.GET:  # a chooser's search: its forms are built for it alone
        choosers = CanaryForm(endpoint=endpoint), _evaluate_form(request, endpoint, [])
        if picked := pick_response(request, *choosers):
            return picked
    return _render_endpoint(request, endpoint)


def _render_endpoint(request: HttpRequest, endpoint, new_key: str | None = None) -> HttpResponse:
    # The state from the active revisions; the history (every revision) and the keys a page
    # at a time.
    active = list(selectors.endpoint_revisions(endpoint).filter(status="active"))
    revisions, revisions_query = paginate(
        request, selectors.endpoint_revisions(endpoint), param="revisions", per_page=20
    )
    keys, keys_query = paginate(request, selectors.endpoint_keys(endpoint), param="keys")
    can_write = role_allows(request.membership.role, Perm.DEPLOYMENT_WRITE)
    generative = endpoint.task_kind in GENERATIVE_KINDS
    adapters = list(selectors.endpoint_adapters(endpoint)) if generative else []
    # Each adapter's state on every placement of an active revision (the serving hosts').
    placements = [p for r in active for p in r.placements.all()]
    adapter_rows = [(a, [(p, p.adapters.get(a.name)) for p in placements]) for a in adapters]
    # Each running canary beside the serving version (the quality gate, deployment.quality).
    canaries = [
        (r, comparison)
        for r in active
        if r.pk != endpoint.stable_revision_id
        and (comparison := compare_with_serving(endpoint, r.model_version))
    ]
    return render(
        request,
        "deployment/endpoint.html",
        {
            "endpoint": endpoint,
            "generative": generative,
            "base_url": f"{settings.SERVING_PUBLIC_URL}/v1",
            "state": (state := selectors.endpoint_state(endpoint, active)),
            "state_label": selectors.ENDPOINT_STATES[state],
            "revisions": revisions,
            "revisions_query": revisions_query,
            "active": active,
            "url": endpoint.inference_url,
            "keys": keys,
            "keys_query": keys_query,
            "new_key": new_key,
            "key_form": KeyForm(adapters=[a.name for a in adapters]),
            "adapter_rows": adapter_rows,
            "evaluations": selectors.endpoint_evaluations(endpoint)[:20] if generative else [],
            "evaluate_form": _evaluate_form(request, endpoint, adapters)
            if generative and role_allows(request.membership.role, Perm.TRAINING_WRITE)
            else None,
            "adapter_form": AdapterForm(versions=adapter_versions(endpoint))
            if generative and can_write
            else None,
            "canary_form": CanaryForm(endpoint=endpoint),
            "canaries": canaries,
            "worse_canaries": {r.pk for r, comparison in canaries if comparison["worse"]},
            "can_write": can_write,
            "can_roll_back": len(active) > 1
            or bool(endpoint.stable_revision and endpoint.stable_revision.replaced_id),
        },
    )


def _evaluate_form(request: HttpRequest, endpoint, adapters, data=None) -> EndpointEvaluateForm:
    return EndpointEvaluateForm(
        data,
        endpoint=endpoint,
        evaluation_sets=team_evaluation_sets(request.team),
        adapters=[a.name for a in adapters],
    )


def _action(request: HttpRequest, endpoint, call, done: str) -> HttpResponse:
    try:
        call()
    except ValidationError as exc:
        messages.error(request, error_text(exc))
    else:
        messages.success(request, done)
    return _endpoint_page(request, endpoint)


@team_view(write=Perm.DEPLOYMENT_WRITE)
@require_POST
def endpoint_canary(request: HttpRequest, endpoint_id: int) -> HttpResponse:
    endpoint = selectors.endpoint_get(request.team, endpoint_id)
    form = CanaryForm(request.POST, endpoint=endpoint)
    if not form.is_valid():
        return _form_refused(request, endpoint, form)
    # A version worse than the serving one is shown with the comparison first: the user
    # confirms (or not); nothing is refused.
    comparison = compare_with_serving(endpoint, form.cleaned_data["model_version"])
    if comparison and comparison["worse"] and not request.POST.get("confirm_worse"):
        return render(
            request,
            "deployment/canary_confirm.html",
            {"endpoint": endpoint, "form": form, "comparison": comparison},
        )
    return _action(
        request,
        endpoint,
        lambda: rollout.revision_add(actor=request.user, endpoint=endpoint, **form.cleaned_data),
        _("The canary takes its share of the traffic once it is ready."),
    )


@team_view(write=Perm.DEPLOYMENT_WRITE)
@require_POST
def revision_promote(request: HttpRequest, endpoint_id: int, revision_id: int) -> HttpResponse:
    endpoint = selectors.endpoint_get(request.team, endpoint_id)
    revision = selectors.revision_get(endpoint, revision_id)
    return _action(
        request,
        endpoint,
        lambda: rollout.revision_promote(actor=request.user, revision=revision),
        _("Promoted: this revision takes all the traffic."),
    )


@team_view(write=Perm.DEPLOYMENT_WRITE)
@require_POST
def revision_weight(request: HttpRequest, endpoint_id: int, revision_id: int) -> HttpResponse:
    endpoint = selectors.endpoint_get(request.team, endpoint_id)
    revision = selectors.revision_get(endpoint, revision_id)
    weight = request.POST.get("weight", "")
    if not weight.isdigit():
        messages.error(request, _("A traffic share is between 0 and 100 %."))
        return _endpoint_page(request, endpoint)
    return _action(
        request,
        endpoint,
        lambda: rollout.revision_set_weight(
            actor=request.user, revision=revision, weight=int(weight)
        ),
        _("The traffic split is changed."),
    )


@team_view(write=Perm.DEPLOYMENT_WRITE)
@require_POST
def endpoint_rollback(request: HttpRequest, endpoint_id: int) -> HttpResponse:
    endpoint = selectors.endpoint_get(request.team, endpoint_id)
    return _action(
        request,
        endpoint,
        lambda: rollout.endpoint_rollback(actor=request.user, endpoint=endpoint),
        _("Rolled back: all traffic goes to the last good revision."),
    )


@team_view(write=Perm.DEPLOYMENT_WRITE)
@require_POST
def endpoint_delete(request: HttpRequest, endpoint_id: int) -> HttpResponse:
    endpoint = selectors.endpoint_get(request.team, endpoint_id)
    rollout.endpoint_delete(actor=request.user, endpoint=endpoint)
    messages.success(request, _("The endpoint is deleted."))
    return redirect("deployment:endpoints", team=request.team.slug)


@team_view(write=Perm.DEPLOYMENT_WRITE)
@require_http_methods(["GET", "HEAD", "POST"])
def key_create(request: HttpRequest, endpoint_id: int) -> HttpResponse:
    endpoint = selectors.endpoint_get(request.team, endpoint_id)
    if request.method != "POST":
        # The page that showed a new key has this address: its links (pagers) come back here.
        page = reverse("deployment:endpoint", args=[request.team.slug, endpoint.pk])
        query = request.GET.urlencode()
        return redirect(f"{page}?{query}" if query else page)
    names = list(selectors.endpoint_adapters(endpoint).values_list("name", flat=True))
    form = KeyForm(request.POST, adapters=names)
    if not form.is_valid():
        return _form_refused(request, endpoint, form)
    try:
        _key, plain = endpoint_key_create(
            actor=request.user, endpoint=endpoint, **form.cleaned_data
        )
    except ValidationError as exc:
        messages.error(request, error_text(exc))
        return _endpoint_page(request, endpoint)
    # Shown this once, in this very answer: only its hash is kept, and the plain key is
    # stored nowhere on the way (no session, no message, no cache).
    response = _render_endpoint(request, endpoint, new_key=plain)
    add_never_cache_headers(response)
    return response


@team_view(write=Perm.DEPLOYMENT_WRITE)
@require_POST
def key_revoke(request: HttpRequest, endpoint_id: int, endpoint_key_id: int) -> HttpResponse:
    endpoint = selectors.endpoint_get(request.team, endpoint_id)
    key = selectors.endpoint_key_get(endpoint, endpoint_key_id)
    endpoint_key_revoke(actor=request.user, key=key)
    messages.success(request, _("The key is revoked."))
    return _endpoint_page(request, endpoint)


@team_view(write=Perm.DEPLOYMENT_WRITE)
@require_POST
def endpoint_adapter_add(request: HttpRequest, endpoint_id: int) -> HttpResponse:
    endpoint = selectors.endpoint_get(request.team, endpoint_id)
    form = AdapterForm(request.POST, versions=adapter_versions(endpoint))
    if not form.is_valid():
        return _form_refused(request, endpoint, form)
    return _action(
        request,
        endpoint,
        lambda: adapter_add(actor=request.user, endpoint=endpoint, **form.cleaned_data),
        _("The adapter is added: the serving hosts load it beside the model."),
    )


@team_view(write=Perm.DEPLOYMENT_WRITE)
@require_POST
def endpoint_adapter_remove(
    request: HttpRequest, endpoint_id: int, adapter_id: int
) -> HttpResponse:
    endpoint = selectors.endpoint_get(request.team, endpoint_id)
    adapter = selectors.endpoint_adapter_get(endpoint, adapter_id)
    adapter_remove(actor=request.user, adapter=adapter)
    messages.success(request, _("The adapter is removed."))
    return _endpoint_page(request, endpoint)


@team_view(write=Perm.TRAINING_WRITE)
@require_POST
def endpoint_evaluate(request: HttpRequest, endpoint_id: int) -> HttpResponse:
    """Score the endpoint (or one of its adapters) on an evaluation set, through its API."""
    endpoint = selectors.endpoint_get(request.team, endpoint_id)
    adapters = list(selectors.endpoint_adapters(endpoint))
    form = _evaluate_form(request, endpoint, adapters, request.POST)
    if not form.is_valid():
        return _form_refused(request, endpoint, form)
    try:
        evaluation = endpoint_evaluation_start(
            actor=request.user,
            team=request.team,
            endpoint=endpoint,
            dataset_version=form.cleaned_data["evaluation_set"],
            adapter=form.cleaned_data["adapter"] or "",
            max_new_tokens=form.cleaned_data["max_new_tokens"],
        )
    except ValidationError as exc:
        messages.error(request, error_text(exc))
        return _endpoint_page(request, endpoint)
    messages.success(request, _("The evaluation is queued; its figures come on this page."))
    return redirect(
        "training:model_evaluation", team=request.team.slug, evaluation_id=evaluation.pk
    )


@team_view(write=Perm.TRAINING_WRITE)
def evaluation_judge(request: HttpRequest, evaluation_id: int) -> HttpResponse:
    """Have another endpoint of the team judge an evaluation's open questions."""
    evaluation = model_evaluation_get(request.team, evaluation_id)
    form = JudgeForm(
        request.POST or None,
        endpoints=judge_endpoints(evaluation),
        initial={"rubric": evaluation.judge.get("rubric") or DEFAULT_RUBRIC},
    )
    if picked := pick_response(request, form):
        return picked
    if request.method == "POST" and form.is_valid():
        try:
            judge_start(actor=request.user, evaluation=evaluation, **form.cleaned_data)
        except ValidationError as exc:
            form.add_error(None, error_text(exc))
        else:
            messages.success(request, _("The judge is at work; its scores come on this page."))
            return redirect(
                "training:model_evaluation", team=request.team.slug, evaluation_id=evaluation.pk
            )
    return render(
        request, "deployment/evaluation_judge.html", {"evaluation": evaluation, "form": form}
    )


@team_view(write=Perm.LABELING_MANAGE)
def preannotate(request: HttpRequest, project_id: int) -> HttpResponse:
    project = labeling_project_get(request.team, project_id)
    endpoints = selectors.team_endpoints(request.team).filter(
        task_kind=project.source_version.dataset.task_kind
    )
    form = PreannotateForm(request.POST or None, endpoints=endpoints)
    if picked := pick_response(request, form):
        return picked
    if request.method == "POST" and form.is_valid():
        try:
            preannotate_start(
                actor=request.user, project=project, endpoint=form.cleaned_data["endpoint"]
            )
        except ValidationError as exc:
            form.add_error(None, error_text(exc))
        else:
            messages.success(
                request,
                _("Pre-annotation has started: predictions appear in Label Studio as they come."),
            )
            return redirect("labeling:project", team=request.team.slug, project_id=project.pk)
    return render(request, "deployment/preannotate.html", {"project": project, "form": form})
