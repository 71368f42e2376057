// The endpoint page: its traffic charts (the metrics API, polled every 5 s), the try-it box
// (the console's predict API, which calls the endpoint as the platform and is counted) and, for
// generative endpoints, the chat playground (the console's chat API: server-sent events of
// OpenAI's chat.completion.chunk, shown token by token).
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
      .map((k, i) => `<span><span style="color:${COLOURS[i]}" aria-hidden="true">■</span> ${k}</span>`).join(" ");
    line(document.getElementById("error-chart"), [pts("error_rate")]);
    if (root.dataset.generative !== undefined) {
      set("tokens_per_s", fmt(t.tokens_per_s, 1));
      set("ttft", `${fmt(t.ttft_p50_ms, 1)} / ${fmt(t.ttft_p95_ms, 1)}`);
      line(document.getElementById("tokens-chart"), [pts("tokens_per_s")]);
      line(document.getElementById("ttft-chart"), [withData("ttft_p50_ms"), withData("ttft_p95_ms")], ["p50", "p95"]);
      document.getElementById("ttft-legend").innerHTML = ["p50", "p95"]
        .map((k, i) => `<span><span style="color:${COLOURS[i]}" aria-hidden="true">■</span> ${k}</span>`).join(" ");
    }
  }

  // -- the chat playground ------------------------------------------------------------------
  const chat = document.getElementById("chat-form");
  if (chat) {
    const log = document.getElementById("chat-log");
    const stats = document.getElementById("chat-stats");
    let history = [];

    function bubble(role, text) {
      const el = document.createElement("div");
      el.className = `chat-turn chat-${role}`;
      el.dataset.role = role;
      el.textContent = text;
      log.appendChild(el);
      return el;
    }

    document.getElementById("chat-clear").addEventListener("click", () => {
      history = [];
      log.textContent = "";
      stats.textContent = "";
    });

    chat.addEventListener("submit", async (event) => {
      event.preventDefault();
      const input = document.getElementById("chat-input");
      const text = input.value.trim();
      if (!text) return;
      input.value = "";
      history.push({ role: "user", content: text });
      bubble("user", text);
      const reply = bubble("assistant", "");
      reply.classList.add("streaming");
      const system = document.getElementById("chat-system").value.trim();
      const messages = system ? [{ role: "system", content: system }, ...history] : history;
      const started = performance.now();
      let first = null;
      let chunks = 0;
      let failed = null;
      const response = await fetch(root.dataset.chatUrl, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": csrf },
        body: JSON.stringify({
          messages: messages,
          max_tokens: +document.getElementById("chat-max-tokens").value,
          temperature: +document.getElementById("chat-temperature").value,
          top_p: +document.getElementById("chat-top-p").value,
        }),
      });
      if (!response.ok) {
        failed = JSON.stringify(await response.json());
      } else {
        const reader = response.body.getReader();
        const decoder = new TextDecoder();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += decoder.decode(value, { stream: true });
          let cut;
          while ((cut = buffer.indexOf("\n\n")) >= 0) {
            const line = buffer.slice(0, cut).replace(/^data: /, "");
            buffer = buffer.slice(cut + 2);
            if (line === "[DONE]") continue;
            const event = JSON.parse(line);
            if (event.error) { failed = event.error.message; continue; }
            const delta = (event.choices && event.choices[0] && event.choices[0].delta) || {};
            if (delta.content) {
              if (first === null) first = performance.now();
              chunks += 1;
              reply.textContent += delta.content;
            }
          }
        }
      }
      reply.classList.remove("streaming");
      if (failed) {
        reply.classList.add("error");
        reply.textContent = failed;
        history.pop();
        return;
      }
      history.push({ role: "assistant", content: reply.textContent });
      const total = (performance.now() - started) / 1000;
      stats.textContent = `TTFT ${first === null ? "–" : Math.round(first - started)} ms · ${chunks} chunks · ${total.toFixed(2)} s`;
      refresh();
    });
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

  // -- the canary's preview: the chosen version beside the serving one (the compare API) ------
  const preview = document.getElementById("canary-preview");
  const choice = document.getElementById("id_model_version");
  if (preview && choice) {
    const L = preview.dataset;
    const signed = (v) => (v === null || v === undefined ? "–" : (v > 0 ? "+" : "") + fmt(v, 4));
    function cell(tag, text, cls) {
      const el = document.createElement(tag);
      el.textContent = text;
      if (cls) el.className = cls;
      return el;
    }
    let asked = 0;  // only the answer for the latest choice is shown (choices may overlap)
    async function compare() {
      const mine = ++asked;
      const response = await fetch(`${L.compareUrl}?model_version=${encodeURIComponent(choice.value)}`, { credentials: "same-origin" });
      const c = response.ok ? (await response.json()).comparison : null;
      if (mine !== asked) return;
      preview.textContent = "";
      delete preview.dataset.worse;
      if (!c) return;
      preview.dataset.worse = c.worse;
      if (c.worse) preview.appendChild(cell("p", L.lWorse, "message error")).dataset.testid = "preview-worse";
      if (c.caveat) preview.appendChild(cell("p", c.caveat, "notice small"));
      const table = document.createElement("table");
      table.className = "list";
      const head = table.createTHead().insertRow();
      [L.lMetric, `${L.lServing} (${c.serving.name})`, `${L.lCandidate} (${c.candidate.name})`, L.lDelta]
        .forEach((t) => head.appendChild(cell("th", t)));
      const body = table.createTBody();
      const rows = [[c.metric, c.serving.value, c.candidate.value, c.delta, c.worse]]
        .concat(c.per_label.map((r) => [`F1 · ${r.label}`, r.serving, r.candidate, r.delta, false]));
      rows.forEach(([name, a, b, d, bad]) => {
        const tr = body.insertRow();
        [name, fmt(a, 4), fmt(b, 4)].forEach((t) => tr.appendChild(cell("td", t)));
        tr.appendChild(cell("td", signed(d), bad ? "error" : ""));
      });
      preview.appendChild(table);
    }
    choice.addEventListener("change", compare);
    compare();
  }

  refresh();
  setInterval(refresh, 5000);
})();
