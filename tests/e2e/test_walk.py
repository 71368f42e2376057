"""Every console page, walked in a browser in Chinese: each is checked by axe-core (no serious or
critical accessibility violation) and for English interface words left on it (identifiers, file
names, product names and code excepted). The pages are every HTML route of the URLconf with an
object of each kind (tests.helpers.routes), so that a page added later is walked too.
"""

import re
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from console.roles import Role
from tests.helpers.browser import login
from tests.helpers.routes import object_factories, routes

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

AXE = Path(__file__).parent / "axe" / "node_modules" / "axe-core" / "axe.min.js"

# Names that stay as they are in a Chinese interface: products, formats, units, standards.
NAMES = {
    *"api cpu gpu npu xpu dcu csv xlsx jsonl json utf gbk url http https tls ldap sso oidc".split(),
    *"onnx lora dpo sft ema ner f1 id ip qps ttft p50 p95 p99 int8 fp16 bf16 amp mlm dapt".split(),
    *"redis celery postgresql sqlite prometheus grafana openid dingtalk wecom feishu smtp".split(),
    *"paddle paddlenlp paddleslim paddle2onnx torch pytorch onnxruntime lite label studio".split(),
    *"ernie llama qwen bert gru crf cnn lr tf idf tfidf bigru ngram transformer adam".split(),
    *"openai python linux gunicorn nginx kubernetes docker html pdf png svg js css".split(),
    *"xlsx ok gb mb kb tb ms min tsv rest webhook chatml hugging face transformers".split(),
    *"paddlepaddle fastdeploy vllm mlu nvidia ascend huawei hygon kunlunxin cambricon".split(),
    # Terms Chinese ML tools keep in English.
    *"token tokens dropout alpha beta rank batch epoch worker".split(),
}
# Text of these elements is code, data or a user's own words, not the interface.
SKIP = "code, pre, kbd, samp, textarea, script, style, noscript, [translate=no], .user-text"
WORDS = """
(skip) => {
  // The text a reader meets: shown text nodes, the choices of selects, and the placeholders,
  // labels and titles of the controls (each apart: table cells are not run together).
  const parts = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const parent = node.parentElement;
    if (!parent || parent.closest(skip)) continue;
    if (parent.tagName === "OPTION" || parent.checkVisibility()) parts.push(node.nodeValue);
  }
  for (const e of document.querySelectorAll("[placeholder], [aria-label], [title]")) {
    for (const a of ["placeholder", "aria-label", "title"]) {
      if (e.getAttribute(a) && !e.closest(skip)) parts.push(e.getAttribute(a));
    }
  }
  return parts.join("\\n");
}
"""
# The controls a keyboard must reach: every shown, enabled one, marked so that Tab's stops can
# be told apart; returns how many.
CONTROLS = """() => {
  const all = document.querySelectorAll(
    "a[href], button, input:not([type=hidden]), select, textarea, summary, [tabindex]"
  );
  let n = 0;
  for (const e of all) {
    if (e.disabled || e.tabIndex < 0 || !e.checkVisibility()) continue;
    e.dataset.walk = String(n++);
  }
  return n;
}"""
AXE_RUN = """async () => {
  const r = await axe.run(document, {resultTypes: ["violations"]});
  return r.violations.filter((v) => ["serious", "critical"].includes(v.impact))
    .map((v) => v.id + ": " + v.nodes.slice(0, 3).map((n) => n.target.join(" ")).join(" | "));
}"""


def english_words(text: str, allowed: set[str]) -> set[str]:
    """Words of Latin letters that are no identifier (no digit, _, -, ., /, :, @ in the
    token), no product name and no name of an object of the page."""
    found = set()
    for token in re.split(r"[\s\u3000-\u303f\uff00-\uffef，。、：；（）“”‘’《》]+", text):
        if not token or re.search(r"[\d_\-./:@=#%&+{}<>\\]", token):
            continue
        for word in re.findall(r"[A-Za-z]+(?:'[a-z]+)?", token):
            if len(word) > 1 and word.lower() not in NAMES and word.lower() not in allowed:
                found.add(word)
    return found


# Routes that are no page to read: downloads, streams, actions reached by a form only.
NOT_PAGES = re.compile(
    r"(download|archive|export|_log$|events|webhook|logout|metrics|oidc|set_language|label_studio$|health$|pick)"
)


@pytest.fixture
def world(make_user, make_team, celery_worker_process):
    boss = get_user_model().objects.create_superuser("admin", password="Admin-Pass-2026")
    team = make_team("feng-kong", {boss: Role.OWNER})
    team.name = "风控模型组"
    team.save(update_fields=["name"])
    objects = {kwarg: factory() for kwarg, factory in object_factories(team, boss).items()}
    return team, objects


def test_every_page_in_chinese_is_accessible_and_says_nothing_in_english(page, world):
    if not AXE.exists():
        pytest.skip("axe-core is not installed (npm ci --prefix tests/e2e/axe)")
    team, objects = world
    login(page, "admin", "Admin-Pass-2026")
    names = {str(v).lower() for v in objects.values()} | {team.slug, "admin"}
    problems: dict[str, list[str]] = {}
    walked = 0
    for route in routes():
        if route.is_api or NOT_PAGES.search(route.name):
            continue
        kwargs = {k: (team.slug if k == "team" else objects.get(k)) for k in route.kwargs}
        if None in kwargs.values():
            continue
        url = reverse(route.name, kwargs=kwargs)
        # Asked first with the page's cookies: a route that answers no HTML page (a POST-only
        # action, a download) is not one to walk.
        head = page.request.get(url, max_redirects=0)
        if head.status != 200 or "text/html" not in (head.headers.get("content-type") or ""):
            continue
        page.goto(url)
        walked += 1
        page.wait_for_load_state("networkidle")
        page.add_script_tag(path=str(AXE))
        result = page.evaluate(AXE_RUN)
        words = english_words(page.evaluate(WORDS, SKIP), names)
        found = result + ([f"English: {' '.join(sorted(words))}"] if words else [])
        found += unreachable_by_keyboard(page)
        if found:
            problems[f"{route.name} {url}"] = found
    assert walked >= 30, walked
    assert not problems, "\n" + "\n".join(
        f"{where}\n  " + "\n  ".join(found) for where, found in sorted(problems.items())
    )


def unreachable_by_keyboard(page) -> list[str]:
    """Tab from the top of the page through every control: each shown one must take the focus
    (no control left out of the tab order, no trap)."""
    total = page.evaluate(CONTROLS)
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    reached: set[str] = set()
    for _ in range(2 * total + 10):  # stops the walk does not mark (a link in a table) too
        page.keyboard.press("Tab")
        mark = page.evaluate("() => document.activeElement?.dataset?.walk ?? null")
        if mark is not None:
            reached.add(mark)
        if len(reached) == total:
            return []
    missed = page.evaluate(
        """(reached) => [...document.querySelectorAll("[data-walk]")]
          .filter((e) => !reached.includes(e.dataset.walk)).slice(0, 5)
          .map((e) => e.outerHTML.slice(0, 80))""",
        sorted(reached),
    )
    return [f"keyboard: {total - len(reached)} of {total} controls not reached: {missed}"]
