// The new-job form's live guide: after each change the page answers a preview (#job-guide,
// training.views._job_form_page) whose data-guide says each field's recommended value, the
// fields the job does not use, and the errors of what was entered. Applied to the form as it
// stands, so that nothing typed meanwhile is lost.
(function () {
  "use strict";

  function apply(guide) {
    const form = document.getElementById("job-form");
    if (!form || !guide) return;
    for (const [name, text] of Object.entries(guide.placeholders || {})) {
      const input = form.elements.namedItem(name);
      if (input && "placeholder" in input) {
        if (text) input.placeholder = text;
        else input.removeAttribute("placeholder");
      }
    }
    const hidden = new Set(guide.hidden || []);
    for (const wrapper of form.querySelectorAll("[data-field]")) {
      wrapper.hidden = hidden.has(wrapper.dataset.field);
    }
    const llm = form.querySelector('[data-testid="llm-hyperparameters"]');
    if (llm) {
      const shown = [...llm.querySelectorAll("[data-field]")].some((w) => !w.hidden);
      llm.hidden = !shown;
      if (shown) llm.open = true;
    }
    // Errors: the server's lists of the last submit stay until their field changes; the
    // preview's own replace each other.
    for (const old of form.querySelectorAll("ul.errorlist.preview")) old.remove();
    for (const [name, messages] of Object.entries(guide.errors || {})) {
      const wrapper = form.querySelector(`[data-field="${CSS.escape(name)}"]`);
      const list = document.createElement("ul");
      list.className = "errorlist preview";
      list.id = `id_${name}_preview_error`;
      for (const message of messages) {
        const item = document.createElement("li");
        item.textContent = message;
        list.append(item);
      }
      (wrapper || form).append(list);
    }
  }

  document.addEventListener("htmx:afterSwap", function () {
    const guide = document.getElementById("job-guide");
    if (guide && guide.dataset.guide) apply(JSON.parse(guide.dataset.guide));
  });
  document.addEventListener("change", function (event) {
    // A field the user changes loses the error the last submit had put beside it.
    const wrapper = event.target.closest && event.target.closest("[data-field]");
    if (wrapper) for (const old of wrapper.querySelectorAll("ul.errorlist:not(.preview)")) old.remove();
  });
})();
