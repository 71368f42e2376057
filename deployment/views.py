from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from console.permissions import team_view


@team_view()
def endpoints(request: HttpRequest) -> HttpResponse:
    return render(request, "deployment/endpoints.html")
