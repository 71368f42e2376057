from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from console.permissions import team_view


@team_view()
def datasets(request: HttpRequest) -> HttpResponse:
    return render(request, "labeling/datasets.html")


@team_view()
def projects(request: HttpRequest) -> HttpResponse:
    return render(request, "labeling/projects.html")
