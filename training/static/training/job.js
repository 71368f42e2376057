// The job page, live: polls the job's events (the REST API, session login) every second while
// the job is queued or running, and draws the progress bar, the loss and dev-metric curves and
// the log tail. No library: the charts are plain SVG (console/chart.js).
(function () {
  "use strict";
  const root = document.getElementById("job");
  if (!root) return;
  const url = root.dataset.eventsUrl;
  const { line, ema, COLOURS } = window.platformChart;
  const smoothing = document.getElementById("loss-smoothing");
  const loss = [];
  const metrics = {};
  let after = 0;
  let wasActive = root.dataset.active === "1";
  const statusLabels = JSON.parse(root.dataset.statusLabels || "{}");

  function fmtEta(s) {
    if (s === null || s === undefined) return "–";
    s = Math.round(s);
    return s >= 60 ? Math.floor(s / 60) + " min " + (s % 60) + " s" : s + " s";
  }

  function draw() {
    // The raw loss, pale, under its moving average (the slider's weight; 0: raw only).
    const weight = +smoothing.value;
    document.getElementById("loss-smoothing-value").textContent = weight.toFixed(2);
    const chart = document.getElementById("loss-chart");
    if (weight) line(chart, [loss, ema(loss, weight)], ["raw", "smoothed"], [0]);
    else line(chart, [loss], ["raw"]);
    const names = Object.keys(metrics).filter((k) => k !== "support");
    line(document.getElementById("metric-chart"), names.map((k) => metrics[k]), names);
    document.getElementById("metric-legend").innerHTML = names
      .map((k, i) => `<span><span style="color:${COLOURS[i % COLOURS.length]}" aria-hidden="true">■</span> ${k}</span>`).join(" ");
  }

  function apply(job, events) {
    const log = document.getElementById("log");
    let logged = "";
    for (const e of events) {
      after = Math.max(after, e.id);
      if (e.kind === "loss") loss.push([e.data.step, e.data.loss]);
      else if (e.kind === "metrics" && e.data.split === "dev") {
        for (const [k, v] of Object.entries(e.data.metrics)) (metrics[k] = metrics[k] || []).push([e.data.step, v]);
      } else if ((e.kind === "log" && !e.data.noise) || e.kind === "error")
        logged += e.data.message + "\n"; // the frameworks' chatter: in the full log only
      else if (e.kind === "resumed") logged += `— resumed from step ${e.data.step} —\n`;
    }
    if (logged) {
      log.textContent = (log.textContent + logged).split("\n").slice(-300).join("\n");
      log.scrollTop = log.scrollHeight;
    }
    const status = root.querySelector("[data-testid=job-status]");
    status.dataset.status = job.status;
    status.textContent = statusLabels[job.status] || job.status;
    root.querySelector("[data-testid=job-phase]").textContent = job.phase || "";
    root.querySelector("[data-testid=waiting]").textContent = job.waiting_reason || "";
    root.querySelector("[data-testid=progress-bar]").style.width = job.progress_percent + "%";
    for (const k of ["step", "total_steps", "epoch", "epochs", "samples_per_s"]) {
      const el = root.querySelector(`[data-k=${k}]`);
      if (el) el.textContent = job[k] ?? "–";
    }
    root.querySelector("[data-k=eta]").textContent = fmtEta(job.eta_s);
    if (job.error) {
      const box = root.querySelector("[data-testid=job-error]");
      box.hidden = false;
      box.textContent = job.error;
    }
    if (events.length) draw();
  }

  async function poll() {
    let active = true;
    try {
      for (;;) {
        const r = await fetch(`${url}?after=${after}`, { headers: { Accept: "application/json" } });
        if (!r.ok) break;
        const body = await r.json();
        apply(body.job, body.events);
        active = body.job.status === "queued" || body.job.status === "running";
        if (body.events.length < 2000) break;
      }
    } catch (err) { /* the next poll tries again */ }
    if (active) setTimeout(poll, 1000);
    else if (wasActive) { wasActive = false; window.location.reload(); }
  }
  smoothing.addEventListener("input", draw);
  document.getElementById("log").textContent = "";
  poll();
})();
