from django.urls import path

from training import api, views

app_name = "training"

T = "t/<slug:team>/"
A = "api/v1/teams/<slug:team>/"
AJ = A + "training-jobs/<int:training_job_id>/"

urlpatterns = [
    path(T + "training/", views.jobs, name="jobs"),
    path(T + "training/new/", views.job_new, name="job_new"),
    path(T + "training/compare/", views.jobs_compare, name="jobs_compare"),
    path(T + "training/<int:training_job_id>/", views.job, name="job"),
    path(T + "training/<int:training_job_id>/log/", views.job_log, name="job_log"),
    path(T + "training/<int:training_job_id>/cancel/", views.job_cancel, name="job_cancel"),
    path(T + "training/<int:training_job_id>/retry/", views.job_retry, name="job_retry"),
    path(T + "training/<int:training_job_id>/clone/", views.job_clone, name="job_clone"),
    path(T + "training/sweeps/", views.sweeps, name="sweeps"),
    path(T + "training/sweeps/new/", views.sweep_new, name="sweep_new"),
    path(T + "training/sweeps/<int:sweep_id>/", views.sweep, name="sweep"),
    path(T + "training/sweeps/<int:sweep_id>/cancel/", views.sweep_cancel, name="sweep_cancel"),
    path(T + "models/", views.models, name="models"),
    path(T + "models/compare/", views.models_compare, name="models_compare"),
    path(T + "models/<int:model_version_id>/", views.model, name="model"),
    path(
        T + "models/<int:model_version_id>/download/", views.model_download, name="model_download"
    ),
    path(T + "base-models/", views.base_models, name="base_models"),
    path(T + "evaluation-sets/", views.evaluation_sets, name="evaluation_sets"),
    path(
        T + "evaluation-sets/<int:dataset_version_id>/",
        views.leaderboard,
        name="leaderboard",
    ),
    path(T + "evaluations/<int:evaluation_id>/", views.model_evaluation, name="model_evaluation"),
    # REST API
    path(A + "presets/", api.PresetList.as_view(), name="api_presets"),
    path(A + "base-models/", api.BaseModelListCreate.as_view(), name="api_base_models"),
    path(
        A + "base-models/<int:base_model_id>/", api.BaseModelDetail.as_view(), name="api_base_model"
    ),
    path(A + "training-jobs/", api.JobListCreate.as_view(), name="api_jobs"),
    path(AJ, api.JobDetail.as_view(), name="api_job"),
    path(AJ + "events/", api.JobEvents.as_view(), name="api_job_events"),
    path(AJ + "cancel/", api.JobCancel.as_view(), name="api_job_cancel"),
    path(AJ + "retry/", api.JobRetry.as_view(), name="api_job_retry"),
    path(AJ + "clone/", api.JobClone.as_view(), name="api_job_clone"),
    path(A + "sweeps/", api.SweepListCreate.as_view(), name="api_sweeps"),
    path(A + "sweeps/<int:sweep_id>/", api.SweepDetail.as_view(), name="api_sweep"),
    path(A + "sweeps/<int:sweep_id>/cancel/", api.SweepCancel.as_view(), name="api_sweep_cancel"),
    path(A + "models/", api.ModelVersionList.as_view(), name="api_models"),
    path(
        A + "models/<int:model_version_id>/evaluations/",
        api.ModelVersionEvaluations.as_view(),
        name="api_model_evaluations",
    ),
    path(
        A + "evaluation-sets/<int:dataset_version_id>/leaderboard/",
        api.Leaderboard.as_view(),
        name="api_leaderboard",
    ),
    path(A + "models/<int:model_version_id>/", api.ModelVersionDetail.as_view(), name="api_model"),
    path(
        A + "models/<int:model_version_id>/base-model/",
        api.ModelVersionBaseModel.as_view(),
        name="api_model_base_model",
    ),
    path(
        A + "models/<int:model_version_id>/compress/",
        api.ModelVersionCompress.as_view(),
        name="api_model_compress",
    ),
    path(
        A + "models/<int:model_version_id>/download/",
        api.ModelVersionDownload.as_view(),
        name="api_model_download",
    ),
]
