from django.urls import path

from deployment import views

app_name = "deployment"

urlpatterns = [
    path("t/<slug:team>/endpoints/", views.endpoints, name="endpoints"),
]
