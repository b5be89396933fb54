"""report.html of a real (tiny) training run, opened in a real headless Chromium over the DevTools protocol:
no console errors, one plotted point per metrics.jsonl row, a known rollout string in the trajectories."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: scripts/setup.sh must install it in CI")
        pytest.skip("chromium is not installed (make setup installs it with apt-get)")
    return exe


class DevTools:
    """A minimal Chrome DevTools Protocol session on one page (websockets' sync client)."""

    def __init__(self, ws_url: str) -> None:
        from websockets.sync.client import connect

        self.ws = connect(ws_url, max_size=64 * 2**20)
        self.next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        me = self.next_id
        self.ws.send(json.dumps({"id": me, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == me:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, method: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        for e in self.events:
            if e.get("method") == method:
                return e
        while time.monotonic() < deadline:
            msg = json.loads(self.ws.recv(timeout=timeout))
            self.events.append(msg)
            if msg.get("method") == method:
                return msg
        raise TimeoutError(method)


@pytest.fixture
def browser(tmp_path):
    exe = _chromium()
    profile = tmp_path / "chromium-profile"
    proc = subprocess.Popen(
        [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1400,1000", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("chromium did not start its DevTools endpoint")
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        pages = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30).read())
        page = next(p for p in pages if p.get("type") == "page")
        yield DevTools(page["webSocketDebuggerUrl"])
    finally:
        proc.kill()
        proc.wait()


def test_report_page_in_a_real_browser(tmp_path, tiny_model_dir, browser):
    from ludic.recipes.qa import QAOptions, TrainQAConfig, train_qa
    from ludic.training.config import TrainerConfig

    run = tmp_path / "run"
    train_qa(TrainQAConfig(
        model=str(tiny_model_dir), qa=QAOptions(max_completion_tokens=6), train_steps=3, eval_limit=4,
        group_size=2, prompts_per_step=2, run_dir=str(run), logger="none", dtype="float32",
        trainer=TrainerConfig(lr=1e-4),
    ))
    page = run / "report.html"
    assert page.exists(), "the run's logger must write report.html when it closes"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    known = json.loads((run / "rollouts.jsonl").read_text().splitlines()[0])["steps"][0]["prev_obs"].split("\n")[0]

    dt = browser
    for domain in ("Page", "Runtime", "Log"):
        dt.call(f"{domain}.enable")
    dt.call("Page.navigate", url=page.as_uri())
    dt.wait_for("Page.loadEventFired")
    plots = json.loads(dt.call("Runtime.evaluate", returnByValue=True, expression=(
        "JSON.stringify([...document.querySelectorAll('svg.plot')].map("
        "s => [s.dataset.metric, s.querySelectorAll('circle.pt').length]))"))["result"]["value"])
    text = dt.call("Runtime.evaluate", returnByValue=True, expression="document.body.innerText")["result"]["value"]
    shot = dt.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
    (run / "report.png").write_bytes(base64.b64decode(shot["data"]))

    errors = [e for e in dt.events if e.get("method") == "Runtime.exceptionThrown"
              or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
              or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")]
    assert errors == []
    by_metric = dict(plots)
    for metric in ("loss", "reward_mean", "grad_norm"):
        assert by_metric[metric] == len(rows) == 3, (metric, by_metric)
    for metric, n in plots:  # every curve: one point per row that carries the metric
        assert n == sum(1 for r in rows if isinstance(r.get(metric), (int, float))), metric
    assert known and known in text
    assert "qa_results.json" in text and "Sample trajectories" in text
    shutil.copy(run / "report.png", Path(os.environ.get("LUDIC_REPORT_SHOT", tmp_path / "shot.png")))


def _open(dt, page: Path) -> None:
    for domain in ("Page", "Runtime", "Log"):
        dt.call(f"{domain}.enable")
    dt.call("Page.navigate", url=page.as_uri())
    dt.wait_for("Page.loadEventFired")


def _js(dt, expression: str):
    """The value of a JS expression, through JSON."""
    return json.loads(dt.call("Runtime.evaluate", returnByValue=True,
                              expression=f"JSON.stringify({expression})")["result"]["value"])


def _errors(dt) -> list[dict]:
    return [e for e in dt.events if e.get("method") == "Runtime.exceptionThrown"
            or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
            or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")]


VISIBLE = "[...document.querySelectorAll('#episodes > .ep')].filter(e => e.offsetParent !== null)"


def _choose(dt, select_id: str, value: str) -> None:
    dt.call("Runtime.evaluate", expression=(
        f"(s => {{ s.value = {json.dumps(value)}; s.dispatchEvent(new Event('change', {{bubbles: true}})); }})"
        f"(document.getElementById({json.dumps(select_id)}))"))


def test_viewer_filters_pairs_and_axes_in_a_real_browser(tmp_path, browser):
    """The viewer's filters, applied in the page, leave the expected episodes visible; the side by side view pairs
    eval_base and eval_trained on the instance (the env seed where none is named); every axis label, a negative one
    included, lies whole inside its plot; the charts come by importance, the constant one folded last."""
    from test_report import BASE_OK, TRAINED_OK, write_behaviour_run

    from ludic.report import build_report

    run = write_behaviour_run(tmp_path / "run")
    dt = browser
    _open(dt, build_report(run))
    assert _js(dt, f"{VISIBLE}.length") == 18
    _choose(dt, "f-outcome", "failure")
    failures = 4 + sum(not ok for ok in BASE_OK.values()) + 1 + sum(not ok for ok in TRAINED_OK.values())
    assert _js(dt, f"{VISIBLE}.length") == failures == 10
    assert _js(dt, "document.getElementById('f-count').textContent") == "10 of 18 episodes shown"
    _choose(dt, "f-stage", "eval_trained")
    assert _js(dt, f"{VISIBLE}.map(e => e.dataset.key)") == ["q3"]
    _choose(dt, "f-stage", "")
    _choose(dt, "f-outcome", "parse_error")
    assert _js(dt, f"{VISIBLE}.map(e => e.dataset.key)") == ["t4", "q3"]
    _choose(dt, "f-outcome", "all")
    dt.call("Runtime.evaluate", expression=(
        "document.querySelector('#episodes .ep[data-stage=\"eval_base\"][data-key=\"q1\"] button.only').click()"))
    assert _js(dt, f"{VISIBLE}.map(e => [e.dataset.stage, e.dataset.key])") == [["eval_base", "q1"], ["eval_trained", "q1"]]

    pairs = _js(dt, "[...document.querySelectorAll('#pairs .pair')].map(p => [...p.children].map("
                    "e => [e.dataset.stage, e.dataset.key, e.dataset.outcome, e.innerText.includes('REPLY-' + e.dataset.key)]))")
    assert [[left[1], right[1]] for left, right in pairs] == [[k, k] for k in ("q0", "q1", "q2", "q3", "seed 77")]
    assert all(left[0] == "eval_base" and right[0] == "eval_trained" for left, right in pairs)
    assert [(left[2], right[2]) for left, right in pairs][1] == ("failure", "success")  # q1: base wrong, trained right
    assert all(left[3] and right[3] for left, right in pairs[:4])  # each side shows its own stage's reply
    dt.call("Runtime.evaluate", expression="document.getElementById('p-changed').click()")
    assert _js(dt, "[...document.querySelectorAll('#pairs .pair')].map(p => p.dataset.key)") == ["q1", "q2", "seed 77"]

    labels = _js(dt, "[...document.querySelectorAll('svg.plot')].flatMap(s => [...s.querySelectorAll('text')].map(t => "
                     "{ const b = t.getBBox(); return [s.dataset.metric, t.textContent, b.x, b.x + b.width, "
                     "s.width.baseVal.value]; }))")
    loss = [text for metric, text, *_ in labels if metric == "policy_loss"]
    assert "-0.0112" in loss and "-0.0412" in loss, loss
    outside = [(m, t) for m, t, x0, x1, w in labels if x0 < 0 or x1 > w]
    assert outside == []
    metrics = _js(dt, "[...document.querySelectorAll('svg.plot')].map(s => s.dataset.metric)")
    assert metrics[:3] == ["eval/success_rate", "success_rate", "reward_mean"] and metrics[-1] == "stale_dropped"
    assert _js(dt, "document.querySelector('details.flat svg.plot').dataset.metric") == "stale_dropped"
    assert _errors(dt) == []


def test_the_recipe_page_draws_its_picture_and_games_in_a_real_browser(tmp_path, browser):
    from test_report import write_recipe_run

    from ludic.report import build_report

    run = write_recipe_run(tmp_path / "recipe")
    dt = browser
    _open(dt, build_report(run))
    assert _js(dt, "document.querySelector('.picture img').naturalWidth") == 1  # the embedded PNG decoded
    games = _js(dt, "[...document.querySelectorAll('details.games[open] .game')].map(g => [g.dataset.outcome, "
                    "g.querySelectorAll('table.board').length, g.querySelectorAll('td.new').length])")
    assert games and all(outcome == "draw" and boards == 9 and marked == 8 for outcome, boards, marked in games)
    assert _js(dt, "document.querySelector('details.games[open] summary').textContent").startswith("rl:")
    assert _js(dt, "document.querySelectorAll('#pairs .pair').length") > 0
    text = _js(dt, "document.body.innerText")
    assert "This stage logged no step" in text and "No rollouts.jsonl" not in text
    assert _errors(dt) == []
