"""Choosers that scale: a select of a team's objects (versions, models, endpoints…) that lists
the chosen one and the first ``PAGE`` others, with a search box that asks the page itself for
the objects matching what is typed (htmx, server-side). A team with 10,000 versions gets a page
as small as one with 10.

The form field stays a ``ModelChoiceField`` on the whole queryset the form gives it, so what is
offered and what is accepted are the form's one definition (a POST of another team's object is
still "not one of the available choices"). A view answers the search with ``pick_response``
before it renders the page::

    form = DeployForm(request.POST or None, team=request.team)
    if picked := pick_response(request, form):
        return picked
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django import forms
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext as _

PAGE = 50  # options a chooser lists at once; typing narrows them
QUERY_MAX = 100  # characters of a search that are used


class SearchSelect(forms.Select):
    """A ``<select>`` of the chosen object and the first ``PAGE`` of a queryset, with a search
    box above it; ``search_fields`` are matched with icontains (a number typed also matches
    ``number_field`` exactly). On a ``ModelChoiceField`` the queryset is the field's; a field of
    its own sets ``source`` (the queryset, an object's value and label, how a value finds its
    object) and may keep a few fixed choices before it (presets, say)."""

    template_name = "console/widgets/search_select.html"

    def __init__(
        self, *args, search_fields: tuple[str, ...], number_field: str = "", **kwargs
    ) -> None:
        super().__init__(*args, **kwargs)
        self.search_fields = search_fields
        self.number_field = number_field
        self.source: Source | None = None

    def search(self, queryset: QuerySet, query: str) -> QuerySet:
        match = Q()
        for word in query.split():
            one = Q()
            for name in self.search_fields:
                one |= Q(**{f"{name}__icontains": word})
            digits = word.lstrip("vV#")
            if self.number_field and digits.isdigit() and len(digits) < 10:
                one |= Q(**{self.number_field: int(digits)})
            match &= one
        return queryset.filter(match)

    def _source(self) -> "Source":
        if self.source is not None:
            return self.source
        model_field = self.choices.field  # a ModelChoiceField's ModelChoiceIterator
        return Source(
            queryset=model_field.queryset,
            value=lambda o: str(o.pk),
            label=model_field.label_from_instance,
            find=lambda v: Q(pk=int(v)) if v.isdigit() and len(v) < 19 else None,
        )

    def options_html(self, value, query: str = "") -> str:
        """The ``<option>`` elements: the fixed choices that match, the chosen object, then the
        first PAGE objects matching."""
        if isinstance(value, list | tuple):  # Select.format_value's list
            value = value[0] if value else None
        value = str(getattr(value, "pk", value) or "")
        query = query.strip()[:QUERY_MAX]
        source = self._source()
        html = format_html_join(
            "", "{}", ((self._fixed(group, value, query),) for group in source.fixed)
        )
        where = source.find(value) if value else None
        chosen = list(source.queryset.filter(where)[:1]) if where is not None else []
        others = self.search(source.queryset, query).exclude(pk__in=[o.pk for o in chosen])
        found = chosen + list(others[: PAGE + 1])
        more = len(found) > PAGE + len(chosen)
        options = format_html_join(
            "",
            '<option value="{}"{}>{}</option>',
            (
                (source.value(o), " selected" if o in chosen else "", source.label(o))
                for o in found[: PAGE + len(chosen)]
            ),
        )
        if more:
            options += format_html(
                '<option disabled value="">{}</option>', _("… more: type to narrow the list")
            )
        if source.group:
            options = format_html('<optgroup label="{}">{}</optgroup>', source.group, options)
        html += options
        if not html:
            html = format_html('<option disabled value="">{}</option>', _("Nothing matches."))
        return html

    @staticmethod
    def _fixed(group: tuple, value: str, query: str) -> str:
        """One fixed choice, or a group of them, kept where its label has every word typed."""
        words = query.lower().split()

        def option(v, label) -> str:
            if not all(w in f"{v} {label}".lower() for w in words):
                return ""
            selected = " selected" if str(v) == value else ""
            return format_html('<option value="{}"{}>{}</option>', v, selected, label)

        first, second = group
        if not isinstance(second, list | tuple):
            return option(first, second)
        inner = format_html_join("", "{}", ((option(v, label),) for v, label in second))
        return format_html('<optgroup label="{}">{}</optgroup>', first, inner) if inner else ""

    def get_context(self, name, value, attrs):
        context = super().get_context(name, value, attrs)
        context["widget"]["options_html"] = self.options_html(value)
        context["widget"]["search_name"] = f"{name}__q"
        return context

    def optgroups(self, name, value, attrs=None):
        return []  # the options are options_html's: never the whole queryset


@dataclass
class Source:
    """What a SearchSelect lists: the queryset, each object's value and label, the condition
    that finds the object of a value (None: no such object), the fixed choices first and the
    group label of the queryset's options."""

    queryset: QuerySet
    value: Callable[[Any], str]
    label: Callable[[Any], str]
    find: Callable[[str], Q | None]
    fixed: list = field(default_factory=list)
    group: str = ""


def pick_response(request: HttpRequest, *page_forms: forms.Form | None) -> HttpResponse | None:
    """The options of the chooser named by ``?pick=`` (of the first of the page's forms that
    has it) matching its search box, or None when the request is not a chooser's search."""
    name = request.GET.get("pick")
    if request.method != "GET" or not name:
        return None
    for form in filter(None, page_forms):
        field = form.fields.get(name)
        if field is not None and isinstance(field.widget, SearchSelect):
            query = request.GET.get(f"{name}__q", "")
            return HttpResponse(field.widget.options_html(request.GET.get(name), query))
    return None
