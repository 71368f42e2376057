from django.urls import path

from labeling import views

app_name = "labeling"

urlpatterns = [
    path("t/<slug:team>/datasets/", views.datasets, name="datasets"),
    path("t/<slug:team>/labeling/", views.projects, name="projects"),
]
