// The endpoint page: its traffic charts (the metrics API, polled every 5 s) and the try-it
// box (the console's predict API, which calls the endpoint as the platform and is counted).
(function () {
  "use strict";
  const root = document.getElementById("endpoint");
  if (!root) return;
  const { line, COLOURS } = window.platformChart;
  const csrf = (document.cookie.match(/csrftoken=([^;]+)/) || [])[1] || "";

  function fmt(v, digits) {
    return v === null || v === undefined ? "–" : (+v).toFixed(digits);
  }

  async function refresh() {
    const response = await fetch(root.dataset.metricsUrl + "?minutes=60", { credentials: "same-origin" });
    if (!response.ok) return;
    const m = await response.json();
    const t = m.total;
    const set = (k, v) => { const el = root.querySelector(`[data-k=${k}]`); if (el) el.textContent = v; };
    set("requests", t.requests);
    set("qps", fmt(t.qps, 3));
    set("latency", `${fmt(t.p50_ms, 1)} / ${fmt(t.p95_ms, 1)} / ${fmt(t.p99_ms, 1)}`);
    set("error_rate", fmt(t.error_rate * 100, 1) + " %");
    set("unauthorized", t.unauthorized);
    set("rate_limited", t.rate_limited);
    const pts = (key) => m.series.map((p, i) => [i, p[key] ?? 0]);
    const withData = (key) => m.series.map((p, i) => [i, p[key]]).filter((p) => p[1] !== null);
    line(document.getElementById("qps-chart"), [pts("qps")]);
    line(document.getElementById("latency-chart"), [withData("p50_ms"), withData("p95_ms"), withData("p99_ms")], ["p50", "p95", "p99"]);
    document.getElementById("latency-legend").innerHTML = ["p50", "p95", "p99"]
      .map((k, i) => `<span style="color:${COLOURS[i]}">■ ${k}</span>`).join(" ");
    line(document.getElementById("error-chart"), [pts("error_rate")]);
  }

  const form = document.getElementById("try-form");
  if (form) {
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const lines = document.getElementById("try-input").value.split("\n").filter((l) => l.trim());
      const inputs = root.dataset.taskKind === "text_pair"
        ? lines.map((l) => { const [a, b] = l.split("\t"); return { text_a: a || "", text_b: b || "" }; })
        : lines;
      const out = document.getElementById("try-output");
      out.textContent = "…";
      const response = await fetch(root.dataset.predictUrl, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": csrf },
        body: JSON.stringify({ inputs: inputs }),
      });
      const body = await response.json();
      out.dataset.status = response.status;
      out.textContent = JSON.stringify(body, null, 2);
      refresh();
    });
  }

  refresh();
  setInterval(refresh, 5000);
})();
