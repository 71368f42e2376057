"""Pages of long lists, the same way on every console page and in the REST API.

Console pages show ``PAGE_SIZE`` objects a page (``?page=N``, links from
``console/_pager.html``); API lists answer DRF's ``LimitOffsetPagination`` envelope
(``count``, ``next``, ``previous``, ``results``; ``?limit=&offset=``), as ``REST_FRAMEWORK``
sets it. A page's database queries do not grow with the number of objects.
"""

from collections.abc import Sequence

from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

PAGE_SIZE = 50


class ApiPagination(LimitOffsetPagination):
    """The REST API's envelope (``REST_FRAMEWORK["DEFAULT_PAGINATION_CLASS"]``), ``PAGE_SIZE``
    by default and at most ``MAX_LIMIT`` whatever ``?limit=`` asks: one call cannot ask for a
    whole table."""

    default_limit = PAGE_SIZE
    max_limit = 1000


def paginate(
    request: HttpRequest,
    items: QuerySet | Sequence,
    *,
    param: str = "page",
    per_page: int = PAGE_SIZE,
) -> tuple[Page, str]:
    """The page of ``items`` that ``?<param>=N`` asks for (the first for anything else, the last
    past the end), and the request's other query parameters, for the pager's links."""
    page = Paginator(items, per_page).get_page(request.GET.get(param))
    query = request.GET.copy()
    query.pop(param, None)
    return page, query.urlencode()


def render_page(
    request: HttpRequest,
    template: str,
    items: QuerySet | Sequence,
    context: dict | None = None,
    *,
    name: str = "page",
) -> HttpResponse:
    """A console page listing ``items``: the page of them the request asks for (as ``name``)
    and ``query`` for ``console/_pager.html``'s links, besides ``context``."""
    page, query = paginate(request, items)
    return render(request, template, {name: page, "query": query, **(context or {})})


class PaginatedList:
    """A mixin of API views whose GET answers a list: one page of it. ``pagination_class``
    also tells drf-spectacular to describe the answer as that page."""

    pagination_class = api_settings.DEFAULT_PAGINATION_CLASS

    def paginated(
        self, request: Request, items: QuerySet | Sequence, serializer, **kwargs
    ) -> Response:
        """``serializer(page, many=True, **kwargs)`` in the pagination envelope."""
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(items, request, view=self)
        return paginator.get_paginated_response(serializer(page, many=True, **kwargs).data)
