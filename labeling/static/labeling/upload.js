// Chunked, resumable upload through the REST API: declare the file, PUT it chunk by chunk with
// Content-Range, and after a failure ask the server where it stands and go on from there.
(function () {
  "use strict";
  const box = document.getElementById("upload");
  if (!box) return;
  const input = document.getElementById("upload-file");
  const button = document.getElementById("upload-start");
  const bar = document.getElementById("upload-bar");
  const status = document.getElementById("upload-status");
  const chunk = parseInt(box.dataset.chunk, 10);
  const maxBytes = parseInt(box.dataset.maxBytes, 10);
  const headers = { "X-CSRFToken": box.dataset.csrf };
  const t = (s) => (window.gettext ? window.gettext(s) : s);

  function show(done, total) {
    box.querySelector(".progress").hidden = false;
    bar.style.width = (total ? (100 * done) / total : 0).toFixed(1) + "%";
    status.textContent = `${(done / 1048576).toFixed(1)} / ${(total / 1048576).toFixed(1)} MB`;
  }

  function put(url, file, start) {
    // XMLHttpRequest, not fetch: it reports upload progress within a chunk.
    return new Promise((resolve, reject) => {
      const end = Math.min(start + chunk, file.size);
      const xhr = new XMLHttpRequest();
      xhr.open("PUT", url);
      xhr.setRequestHeader("X-CSRFToken", headers["X-CSRFToken"]);
      xhr.setRequestHeader("Content-Type", "application/octet-stream");
      xhr.setRequestHeader("Content-Range", `bytes ${start}-${end - 1}/${file.size}`);
      xhr.upload.onprogress = (e) => show(start + e.loaded, file.size);
      xhr.onload = () => (xhr.status === 200 || xhr.status === 409
        ? resolve(JSON.parse(xhr.responseText)) : reject(new Error(xhr.responseText)));
      xhr.onerror = () => reject(new Error("network"));
      xhr.send(file.slice(start, end));
    });
  }

  async function where(url) {
    const r = await fetch(url, { headers, credentials: "same-origin" });
    if (!r.ok) throw new Error(await r.text());
    return r.json();
  }

  async function upload(file) {
    if (file.size > maxBytes) throw new Error(box.dataset.tooBig || "too big");
    const r = await fetch(box.dataset.createUrl, {
      method: "POST", credentials: "same-origin",
      headers: { ...headers, "Content-Type": "application/json" },
      body: JSON.stringify({ filename: file.name, size: file.size }),
    });
    const created = await r.json();
    if (!r.ok) throw new Error(JSON.stringify(created.detail || created));
    const url = `${box.dataset.createUrl}${created.id}/`;
    let state = created;
    let failures = 0;
    while (state.status !== "complete") {
      try {
        state = await put(url, file, state.received);
        failures = 0;
      } catch (err) {
        if (++failures > 8) throw err;
        await new Promise((ok) => setTimeout(ok, 500 * failures));
        state = await where(url);  // resume where the server stands
      }
      show(state.received, file.size);
    }
    return created.id;
  }

  button.addEventListener("click", async () => {
    const file = input.files[0];
    if (!file) return;
    button.disabled = true;
    try {
      const id = await upload(file);
      window.location = box.dataset.nextUrl.replace("00000000-0000-0000-0000-000000000000", id);
    } catch (err) {
      status.textContent = err.message;
      button.disabled = false;
    }
  });
})();
