from django.urls import path

from labeling import api, views

app_name = "labeling"

T = "t/<slug:team>/"
D = T + "datasets/<int:dataset_id>/"
V = D + "v/<int:number>/"
A = "api/v1/teams/<slug:team>/"
AD = A + "datasets/<int:dataset_id>/"
AV = AD + "versions/<int:number>/"

urlpatterns = [
    path(T + "datasets/", views.datasets, name="datasets"),
    path(D, views.dataset, name="dataset"),
    path(D + "delete/", views.dataset_delete, name="dataset_delete"),
    path(D + "import/<uuid:upload_id>/", views.import_mapping, name="import_mapping"),
    path(D + "compare/", views.compare, name="compare"),
    path(D + "merge/", views.merge, name="merge"),
    path(V, views.version, name="version"),
    path(V + "rows/", views.version_rows, name="version_rows"),
    path(V + "report/", views.version_report, name="version_report"),
    path(V + "download/<slug:kind>/", views.version_download, name="version_download"),
    path(T + "imports/<int:job_id>/", views.import_job, name="import_job"),
    path(T + "labeling/", views.projects, name="projects"),
    path(T + "labeling/<int:project_id>/", views.project, name="project"),
    path(T + "labeling/<int:project_id>/open/", views.project_open, name="project_open"),
    path(V + "label/", views.project_create, name="project_create"),
    path(
        "hooks/label-studio/<int:project_id>/",
        views.label_studio_webhook,
        name="label_studio_webhook",
    ),
    # REST API
    path(A + "datasets/", api.DatasetListCreate.as_view(), name="api_datasets"),
    path(AD, api.DatasetDetail.as_view(), name="api_dataset"),
    path(AD + "imports/", api.ImportCreate.as_view(), name="api_imports"),
    path(AD + "merge/", api.Merge.as_view(), name="api_merge"),
    path(AD + "compare/", api.Compare.as_view(), name="api_compare"),
    path(AD + "versions/", api.VersionList.as_view(), name="api_versions"),
    path(AV, api.VersionDetail.as_view(), name="api_version"),
    path(AV + "rows/", api.VersionRows.as_view(), name="api_version_rows"),
    path(AV + "report/", api.VersionReport.as_view(), name="api_version_report"),
    path(AV + "download/<slug:kind>/", api.VersionDownload.as_view(), name="api_version_download"),
    path(A + "uploads/", api.UploadCreate.as_view(), name="api_uploads"),
    path(A + "uploads/<uuid:upload_id>/", api.UploadDetail.as_view(), name="api_upload"),
    path(
        A + "uploads/<uuid:upload_id>/preview/",
        api.UploadPreview.as_view(),
        name="api_upload_preview",
    ),
    path(A + "imports/<int:job_id>/", api.ImportDetail.as_view(), name="api_import"),
    path(A + "labeling-projects/", api.LabelingProjectListCreate.as_view(), name="api_projects"),
    path(
        A + "labeling-projects/<int:project_id>/",
        api.LabelingProjectDetail.as_view(),
        name="api_project",
    ),
    path(
        A + "labeling-projects/<int:project_id>/sync/",
        api.LabelingProjectSync.as_view(),
        name="api_project_sync",
    ),
    path(
        A + "labeling-projects/<int:project_id>/export/",
        api.LabelingProjectExport.as_view(),
        name="api_project_export",
    ),
    path(
        A + "labeling-projects/<int:project_id>/predictions/",
        api.LabelingProjectPredictions.as_view(),
        name="api_project_predictions",
    ),
]
