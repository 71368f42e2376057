from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from console.permissions import team_view


@team_view()
def jobs(request: HttpRequest) -> HttpResponse:
    return render(request, "training/jobs.html")


@team_view()
def models(request: HttpRequest) -> HttpResponse:
    return render(request, "training/models.html")
