"""Request counters and latency histograms of one serving host, cumulative since it started.

The platform scrapes them (``GET /manage/metrics``) and stores the differences; a new
``boot_id`` tells it that the host restarted and its counters began again at zero.
"""

import bisect
import math
from dataclasses import dataclass, field

# Upper bounds of the latency buckets, in milliseconds: x1.25 from 0.25 ms to about 60 s. The
# platform reads the same list from the scrape, so percentiles are computed from one definition.
BUCKETS_MS: list[float] = [round(0.25 * 1.25**i, 3) for i in range(56)]

# requests: every call to a known endpoint; the others count how calls failed: errors (5xx:
# no revision ready, a predictor failed), client_errors (invalid input), unauthorized (no or a
# wrong key), rate_limited (429). inputs: texts predicted (generative: completions asked for);
# prompt_tokens and completion_tokens: what generative endpoints read and wrote.
COUNTERS = (
    "requests",
    "inputs",
    "errors",
    "client_errors",
    "unauthorized",
    "rate_limited",
    "prompt_tokens",
    "completion_tokens",
)


@dataclass
class Series:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    # One count per bucket plus the overflow bucket.
    latency: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_MS) + 1))
    # Generative endpoints: time to the first token, on the same buckets.
    ttft: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_MS) + 1))
    # The sums of what was observed (ms): Prometheus's histograms carry them.
    latency_sum_ms: float = 0.0
    ttft_sum_ms: float = 0.0

    def observe(self, latency_ms: float) -> None:
        self.latency[bisect.bisect_left(BUCKETS_MS, latency_ms)] += 1
        self.latency_sum_ms += latency_ms

    def observe_ttft(self, ttft_ms: float) -> None:
        self.ttft[bisect.bisect_left(BUCKETS_MS, ttft_ms)] += 1
        self.ttft_sum_ms += ttft_ms

    def as_dict(self) -> dict:
        return {**self.counts, "latency": list(self.latency), "ttft": list(self.ttft)}


class Metrics:
    """Per endpoint, per revision (``""`` for requests that reached no revision)."""

    def __init__(self) -> None:
        self.series: dict[tuple[str, str], Series] = {}

    def get(self, endpoint: str, revision: str = "") -> Series:
        key = (endpoint, revision)
        if key not in self.series:
            self.series[key] = Series()
        return self.series[key]

    def count(self, endpoint: str, revision: str, counter: str, n: int = 1) -> None:
        self.get(endpoint, revision).counts[counter] += n

    def snapshot(self) -> dict:
        out: dict[str, dict] = {}
        for (endpoint, revision), s in self.series.items():
            out.setdefault(endpoint, {})[revision] = s.as_dict()
        return out


def percentile(latency: list[int], q: float) -> float | None:
    """The ``q`` quantile (0..1) of a histogram: the upper bound of the bucket it falls in."""
    total = sum(latency)
    if not total:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for i, n in enumerate(latency):
        seen += n
        if seen >= rank:
            return BUCKETS_MS[i] if i < len(BUCKETS_MS) else BUCKETS_MS[-1]
    return BUCKETS_MS[-1]
