// Several jobs' curves on one chart each (training.views.jobs_compare): the loss, smoothed by
// the slider's weight (console/chart.js's ema), and the dev metric chosen, per epoch. Each job
// keeps its colour in the table's swatch.
(function () {
  "use strict";
  const data = document.getElementById("curves-data");
  if (!data) return;
  const series = JSON.parse(data.textContent);
  const { line, ema, COLOURS } = window.platformChart;
  const names = series.map((s) => String(s.id));
  const smoothing = document.getElementById("compare-smoothing");
  const metric = document.getElementById("compare-metric");

  for (const swatch of document.querySelectorAll(".swatch")) {
    swatch.style.color = COLOURS[Number(swatch.dataset.index) % COLOURS.length];
  }

  function drawLoss() {
    const weight = Number(smoothing.value);
    document.getElementById("compare-smoothing-value").textContent = weight.toFixed(2);
    line(
      document.getElementById("compare-loss-chart"),
      series.map((s) => ema(s.loss, weight)),
      names,
    );
  }

  function drawMetric() {
    if (!metric) return;
    line(
      document.getElementById("compare-metric-chart"),
      series.map((s) => s.dev[metric.value] || []),
      names,
    );
  }

  smoothing.addEventListener("input", drawLoss);
  if (metric) metric.addEventListener("change", drawMetric);
  drawLoss();
  drawMetric();
})();
