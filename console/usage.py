"""Usage accounting and the device-hour quotas.

Device time is recorded from the devices' holds themselves: when a holder (a job's attempt)
lets its devices go, one ``DeviceUse`` says who (team, user, job), what (device type, how many)
and from when to when (``devices_free``). A hold still running counts up to now. Months are
calendar months in the platform's time zone; a use that spans two months is split between
them by time.

A team's quota of device-hours a month per device type (``Team.device_hours_quota``, set by
site staff) is checked when a job would take devices: once the month's use reaches it, the
job waits, saying the quota, the use and when it resets.
"""

import csv
import io
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.translation import gettext_noop

from console.later import later
from console.models import Device, DeviceUse, Team

# Each takes (a team or None for all, the month's start) and returns the month's serving rows
# ({"team", "endpoint", "requests", "errors", "prompt_tokens", "completion_tokens"}):
# registered by the deployment app (console imports none of the apps).
serving_usage: list[Callable[[Team | None, datetime], list[dict]]] = []

_FREE = {
    "holder": "",
    "holder_label": "",
    "holder_team": None,
    "holder_user": None,
    "held_since": None,
}


@transaction.atomic
def devices_free(devices: QuerySet[Device]) -> int:
    """Free ``devices``, recording the device time of each hold among them; returns how
    many were freed."""
    now = timezone.now()
    held = list(
        # of=self: PostgreSQL locks no row of the outer-joined team and user.
        devices.select_for_update(of=("self",))
        .exclude(holder="")
        .select_related("holder_team", "holder_user")
        .order_by("pk")
    )
    uses: dict[tuple, DeviceUse] = {}
    for d in held:
        if d.held_since is None:
            continue
        key = (d.holder, d.device_type, d.held_since)
        if key in uses:
            uses[key].devices += 1
            continue
        uses[key] = DeviceUse(
            team=d.holder_team,
            team_name=d.holder_team.name if d.holder_team else "",
            user=d.holder_user,
            username=d.holder_user.get_username() if d.holder_user else "",
            holder=d.holder,
            label=d.holder_label,
            device_type=d.device_type,
            devices=1,
            started_at=d.held_since,
            ended_at=max(now, d.held_since),
        )
    DeviceUse.objects.bulk_create(uses.values())
    return Device.objects.filter(pk__in=[d.pk for d in held]).update(**_FREE)


def month_start(day: date | datetime | None = None) -> datetime:
    """The start of the calendar month of ``day`` (default: now), in the platform's zone."""
    local = timezone.localtime() if day is None else day
    return timezone.make_aware(datetime(local.year, local.month, 1))


def next_month(start: datetime) -> datetime:
    year, month = (start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1)
    return timezone.make_aware(datetime(year, month, 1))


@dataclass
class Use:
    """Device time within one month: a closed use, or a hold running now."""

    team_id: int | None
    team: str
    username: str
    label: str
    device_type: str
    device_hours: float


def uses_between(
    start: datetime,
    end: datetime,
    *,
    team_ids: list[int] | None = None,
    device_type: str = "",
) -> list[Use]:
    """Every use between ``start`` and ``end`` (of some teams, or all; of one device type, or
    all), each cut to that window; holds still running count up to now."""
    now = timezone.now()

    def within(a: datetime, b: datetime) -> float:
        return max(0.0, (min(b, end) - max(a, start)).total_seconds()) / 3600

    closed = DeviceUse.objects.filter(started_at__lt=end, ended_at__gt=start)
    running = Device.objects.exclude(holder="").filter(held_since__lt=end)
    if team_ids is not None:
        closed = closed.filter(team_id__in=team_ids)
        running = running.filter(holder_team_id__in=team_ids)
    if device_type:
        closed = closed.filter(device_type=device_type)
        running = running.filter(device_type=device_type)
    uses = [
        Use(u.team_id, u.team_name, u.username, u.label, u.device_type,
            u.devices * within(u.started_at, u.ended_at))
        for u in closed
    ]  # fmt: skip
    for d in running.select_related("holder_team", "holder_user"):
        uses.append(
            Use(
                d.holder_team_id,
                d.holder_team.name if d.holder_team else "",
                d.holder_user.get_username() if d.holder_user else "",
                d.holder_label,
                d.device_type,
                within(d.held_since, now),
            )
        )
    return [u for u in uses if u.device_hours > 0]


def month_uses(start: datetime, team: Team | None = None) -> list[Use]:
    """Every use of the month that starts at ``start`` (of one team, or all)."""
    return uses_between(start, next_month(start), team_ids=None if team is None else [team.pk])


def summary(uses: list[Use], by: str) -> list[tuple[tuple, float]]:
    """Device-hours added up by ``by``: "team", "user", "job" (with the device type)."""
    keys = {
        "team": lambda u: (u.team, u.device_type),
        "user": lambda u: (u.team, u.username or "—", u.device_type),
        "job": lambda u: (u.team, u.label or "—", u.username or "—", u.device_type),
    }[by]
    totals: dict[tuple, float] = defaultdict(float)
    for u in uses:
        totals[keys(u)] += u.device_hours
    return sorted(totals.items(), key=lambda kv: (kv[0][0], -kv[1]))


COLUMNS = [
    "month", "team", "kind", "item", "user", "device_type", "device_hours",
    "requests", "prompt_tokens", "completion_tokens",
]  # fmt: skip


def usage_rows(start: datetime, team: Team | None = None) -> list[dict]:
    """The month's lines for chargeback (按部门结算): one per job and device type (device
    time) and one per endpoint or adapter (requests and tokens)."""
    month = start.strftime("%Y-%m")
    rows = [
        {"month": month, "team": t, "kind": "device", "item": label, "user": user,
         "device_type": device, "device_hours": round(hours, 4)}
        for (t, label, user, device), hours in summary(month_uses(start, team), "job")
    ]  # fmt: skip
    for collect in serving_usage:
        for r in collect(team, start):
            rows.append(
                {"month": month, "team": r["team"], "kind": "endpoint", "item": r["endpoint"],
                 "requests": r["requests"], "prompt_tokens": r["prompt_tokens"],
                 "completion_tokens": r["completion_tokens"]}
            )  # fmt: skip
    return [{c: row.get(c, "") for c in COLUMNS} for row in rows]


def usage_csv(start: datetime, team: Team | None = None) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, COLUMNS)
    writer.writeheader()
    writer.writerows(usage_rows(start, team))
    return out.getvalue()


def usage_xlsx(start: datetime, team: Team | None = None) -> bytes:
    from openpyxl import Workbook

    book = Workbook(write_only=True)
    sheet = book.create_sheet(start.strftime("%Y-%m"))
    sheet.append(COLUMNS)
    for row in usage_rows(start, team):
        sheet.append([row[c] for c in COLUMNS])
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def monthly_hours(team: Team, months: int = 6) -> list[dict]:
    """Device-hours of each of the last ``months`` months by device type, oldest first, with
    each month's share of the largest (the page's bars)."""
    starts = [month_start()]
    for _month in range(months - 1):
        starts.insert(0, month_start(starts[0] - timezone.timedelta(days=1)))
    rows = []
    for s in starts:
        by_device: dict[str, float] = defaultdict(float)
        for u in month_uses(s, team):
            by_device[u.device_type] += u.device_hours
        rows.append({"month": s, "hours": dict(by_device), "total": sum(by_device.values())})
    peak = max((r["total"] for r in rows), default=0) or 1
    for r in rows:
        r["percent"] = round(100 * r["total"] / peak)
    return rows


def device_hours_used(team: Team, device_type: str, start: datetime | None = None) -> float:
    start = start or month_start()
    uses = uses_between(start, next_month(start), team_ids=[team.pk], device_type=device_type)
    return sum(u.device_hours for u in uses)


def device_hours_quota(team: Team, device_type: str) -> float | None:
    quota = (team.device_hours_quota or {}).get(device_type)
    return float(quota) if quota is not None else None


def device_hours_share(team: Team, device_type: str) -> float | None:
    """The share of the month's device-hour quota used (None where there is no quota)."""
    quota = device_hours_quota(team, device_type)
    if quota is None:
        return None
    used = device_hours_used(team, device_type)
    return used / quota if quota > 0 else 1.0


def device_hours_check(team: Team, device_type: str) -> str:
    """Why a job of ``team`` on ``device_type`` must wait for its quota ("" when it may run):
    the quota, the month's use and when it resets (a console.later message)."""
    quota = device_hours_quota(team, device_type)
    if quota is None:
        return ""
    start = month_start()
    used = device_hours_used(team, device_type, start)
    if used < quota:
        return ""
    return later(
        gettext_noop(
            "Waiting: the team used %(used).1f of its %(quota)g %(device)s device-hours this "
            "month; they reset on %(reset)s."
        ),
        used=used,
        quota=quota,
        device=device_type,
        reset=timezone.localtime(next_month(start)).date().isoformat(),
    )


def concurrency_limit(team: Team) -> int:
    return team.max_concurrent_jobs or settings.TRAINING_TEAM_CONCURRENCY


# Fair share looks back this far: the team that used a device type least lately goes first.
FAIR_SHARE_DAYS = 7


def recent_device_hours(team_ids: list[int], device_type: str) -> dict[int, float]:
    """Each team's device-hours of ``device_type`` in the last FAIR_SHARE_DAYS, running holds
    up to now."""
    now = timezone.now()
    since = now - timezone.timedelta(days=FAIR_SHARE_DAYS)
    hours = dict.fromkeys(team_ids, 0.0)
    for u in uses_between(since, now, team_ids=team_ids, device_type=device_type):
        if u.team_id in hours:
            hours[u.team_id] += u.device_hours
    return hours
