// Line charts in plain SVG, shared by the console's live pages (no library, no CDN).
// line(svg, series, names, faint): series is a list of [[x, y], …], one polyline each; the
// indexes in ``faint`` are drawn thin and pale (the raw curve under its smoothed one).
// ema(points, weight): the exponential moving average of a curve, debiased at its start as
// TensorBoard's smoothing is; weight 0 is the raw curve.
(function () {
  "use strict";
  const COLOURS = ["#1456f0", "#d83931", "#2ea121", "#de7802", "#7f3bf5"];

  function ema(points, weight) {
    let last = 0;
    return points.map(([x, y], i) => {
      last = last * weight + (1 - weight) * y;
      return [x, weight ? last / (1 - Math.pow(weight, i + 1)) : y];
    });
  }

  function line(svg, series, names, faint) {
    const W = 400, H = 200, P = 30;
    const all = series.flat();
    svg.innerHTML = "";
    if (!all.length) return;
    const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
    const x0 = Math.min(...xs), x1 = Math.max(...xs) || 1;
    let y0 = Math.min(...ys), y1 = Math.max(...ys);
    if (y1 === y0) { y1 += 1; y0 -= y0 ? 0 : 0; }
    const sx = (x) => P + ((x - x0) / (x1 - x0 || 1)) * (W - 2 * P);
    const sy = (y) => H - P - ((y - y0) / (y1 - y0)) * (H - 2 * P);
    const ns = "http://www.w3.org/2000/svg";
    const axis = document.createElementNS(ns, "path");
    axis.setAttribute("d", `M${P},${P} V${H - P} H${W - P}`);
    axis.setAttribute("class", "axis");
    svg.appendChild(axis);
    [[y1, P], [y0, H - P]].forEach(([v, y]) => {
      const t = document.createElementNS(ns, "text");
      t.setAttribute("x", 2); t.setAttribute("y", y + 4); t.setAttribute("class", "tick");
      t.textContent = (+v).toPrecision(3);
      svg.appendChild(t);
    });
    series.forEach((pts, i) => {
      if (!pts.length) return;
      const path = document.createElementNS(ns, "polyline");
      path.setAttribute("points", pts.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" "));
      path.setAttribute("fill", "none");
      path.setAttribute("stroke", COLOURS[i % COLOURS.length]);
      const pale = faint && faint.includes(i);
      path.setAttribute("stroke-width", pale ? "1" : "2");
      if (pale) path.setAttribute("stroke-opacity", "0.3");
      path.setAttribute("data-points", pts.length);
      if (names) path.setAttribute("data-name", names[i]);
      svg.appendChild(path);
    });
  }

  window.platformChart = { line, ema, COLOURS };
})();
