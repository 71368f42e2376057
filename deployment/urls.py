from django.urls import path

from deployment import api, views

app_name = "deployment"

T = "t/<slug:team>/"
TE = T + "endpoints/<int:endpoint_id>/"
A = "api/v1/teams/<slug:team>/"
AE = A + "endpoints/<int:endpoint_id>/"

urlpatterns = [
    path(T + "endpoints/", views.endpoints, name="endpoints"),
    path(T + "endpoints/new/", views.endpoint_new, name="endpoint_new"),
    path(TE, views.endpoint, name="endpoint"),
    path(TE + "canary/", views.endpoint_canary, name="endpoint_canary"),
    path(TE + "rollback/", views.endpoint_rollback, name="endpoint_rollback"),
    path(TE + "delete/", views.endpoint_delete, name="endpoint_delete"),
    path(
        TE + "revisions/<int:revision_id>/promote/",
        views.revision_promote,
        name="revision_promote",
    ),
    path(TE + "revisions/<int:revision_id>/weight/", views.revision_weight, name="revision_weight"),
    path(TE + "adapters/", views.endpoint_adapter_add, name="adapter_add"),
    path(
        TE + "adapters/<int:adapter_id>/remove/",
        views.endpoint_adapter_remove,
        name="adapter_remove",
    ),
    path(TE + "evaluate/", views.endpoint_evaluate, name="endpoint_evaluate"),
    path(TE + "keys/", views.key_create, name="key_create"),
    path(TE + "keys/<int:endpoint_key_id>/revoke/", views.key_revoke, name="key_revoke"),
    path(T + "labeling/<int:project_id>/preannotate/", views.preannotate, name="preannotate"),
    path(
        T + "evaluations/<int:evaluation_id>/judge/",
        views.evaluation_judge,
        name="evaluation_judge",
    ),
    # REST API
    path(A + "endpoints/", api.EndpointListCreate.as_view(), name="api_endpoints"),
    path(AE, api.EndpointDetail.as_view(), name="api_endpoint"),
    path(AE + "revisions/", api.RevisionCreate.as_view(), name="api_revisions"),
    path(AE + "revisions/<int:revision_id>/", api.RevisionDetail.as_view(), name="api_revision"),
    path(
        AE + "revisions/<int:revision_id>/promote/",
        api.RevisionPromote.as_view(),
        name="api_revision_promote",
    ),
    path(AE + "rollback/", api.EndpointRollback.as_view(), name="api_endpoint_rollback"),
    path(AE + "compare/", api.EndpointCompare.as_view(), name="api_endpoint_compare"),
    path(AE + "adapters/", api.AdapterListCreate.as_view(), name="api_adapters"),
    path(AE + "adapters/<int:adapter_id>/", api.AdapterDetail.as_view(), name="api_adapter"),
    path(AE + "evaluations/", api.EndpointEvaluations.as_view(), name="api_endpoint_evaluations"),
    path(AE + "keys/", api.KeyListCreate.as_view(), name="api_keys"),
    path(AE + "keys/<int:endpoint_key_id>/revoke/", api.KeyRevoke.as_view(), name="api_key_revoke"),
    path(AE + "metrics/", api.EndpointMetrics.as_view(), name="api_endpoint_metrics"),
    path(AE + "predict/", api.EndpointPredict.as_view(), name="api_endpoint_predict"),
    path(AE + "chat/", api.EndpointChat.as_view(), name="api_endpoint_chat"),
    path(
        A + "labeling-projects/<int:project_id>/preannotate/",
        api.Preannotate.as_view(),
        name="api_preannotate",
    ),
]
