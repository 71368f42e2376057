from django.urls import path

from training import views

app_name = "training"

urlpatterns = [
    path("t/<slug:team>/training/", views.jobs, name="jobs"),
    path("t/<slug:team>/models/", views.models, name="models"),
]
