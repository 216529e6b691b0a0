"""The HTML report in a real headless Chromium, driven through chromedriver's
W3C WebDriver HTTP API (urllib; no Selenium): it renders, logs no console
error, and its screenshot is a real picture.

Chromium and chromedriver come from Debian's packages (``.ci/run`` installs
them).  Locally the test skips when they are missing; under CI=true it fails.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import struct
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import modtrace
from modtrace.renderers.diff import TIMING_HEADERS, fmt_p
from tests.helpers.ports import free_port
from tests.helpers.report import StepClock, record_tiny

CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "") if p and os.path.exists(p)), None)
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.slow


def _require_browser() -> tuple[str, str]:
    if CHROMIUM and CHROMEDRIVER:
        return CHROMIUM, CHROMEDRIVER
    msg = "chromium and chromedriver are needed (apt-get install -y chromium chromium-driver)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{msg}; under CI the browser test must run")
    pytest.skip(msg)


class WebDriver:
    """The few W3C WebDriver commands the test needs, over HTTP to chromedriver."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.session: str | None = None

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = 60) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read().decode())["value"]
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"WebDriver {method} {path} failed: {exc.read().decode()[:2000]}") from None

    def wait_ready(self, proc: subprocess.Popen[bytes], deadline_s: float = 30) -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise AssertionError(f"chromedriver exited with {proc.returncode}")
            try:
                if self.call("GET", "/status", timeout=2).get("ready"):
                    return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.1)  # polling a process that is starting, not making time pass in a test
        raise AssertionError("chromedriver did not become ready")

    def start(self, chromium: str, profile: Path) -> None:
        caps = {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-background-networking", "--no-first-run", "--window-size=1280,1600",
                    f"--user-data-dir={profile}",
                ],
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        }
        value = self.call("POST", "/session", {"capabilities": {"alwaysMatch": caps}}, timeout=120)
        self.session = value["sessionId"]

    def s(self, path: str) -> str:
        return f"/session/{self.session}{path}"

    def navigate(self, url: str) -> None:
        self.call("POST", self.s("/url"), {"url": url})

    def execute(self, script: str, *args: Any) -> Any:
        return self.call("POST", self.s("/execute/sync"), {"script": script, "args": list(args)})

    def browser_log(self) -> list[dict[str, Any]]:
        return list(self.call("POST", self.s("/se/log"), {"type": "browser"}))

    def screenshot(self) -> bytes:
        return base64.b64decode(self.call("GET", self.s("/screenshot")))

    def quit(self) -> None:
        if self.session:
            try:
                self.call("DELETE", self.s(""), timeout=30)
            finally:
                self.session = None


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    chromium, chromedriver = _require_browser()
    port = free_port()
    proc = subprocess.Popen([chromedriver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    driver = WebDriver(port)
    try:
        driver.wait_ready(proc)
        driver.start(chromium, tmp_path / "profile")
        yield driver
    finally:
        try:
            driver.quit()
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def test_report_renders_in_chromium_without_console_errors(browser: WebDriver, tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = str(tmp_path / "trace.db")
    record_tiny(db, "base", steps=3)
    record_tiny(db, "slow", steps=3, slow_block=1, checkpoint=True)
    page = tmp_path / "report.html"
    result = run_cli("report", "slow", "--vs", "base", "--db", db, "-o", str(page))
    assert result.code == 0, result

    browser.navigate(page.as_uri())
    state = browser.execute(
        """
        var flame = document.getElementById('flame');
        var ctx = flame.getContext('2d');
        var img = ctx.getImageData(0, 0, flame.width, flame.height).data;
        var painted = 0;
        for (var i = 0; i < img.length; i += 4) { if (img[i + 3] > 0) painted++; }
        return {
          rendered: document.body.getAttribute('data-rendered'),
          title: document.getElementById('title').textContent,
          canvas: [flame.width, flame.height],
          painted: painted,
          steps: document.querySelectorAll('#steps-table tbody tr').length,
          options: document.getElementById('step-select').options.length,
          diffShown: !document.getElementById('diff-section').hidden,
          timingRows: document.querySelectorAll('#diff-timing tbody tr').length,
          modules: document.querySelectorAll('#modules-table tbody tr').length,
          issuesText: document.getElementById('issues').textContent,
          resources: performance.getEntriesByType('resource').map(function (r) { return r.name; }),
        };
        """
    )
    # Interaction: hover the forward root (tooltip), click it (zoom), pick another step.
    after = browser.execute(
        """
        var flame = document.getElementById('flame');
        var r = flame.getBoundingClientRect();
        var tip = document.getElementById('tooltip');
        // Along the forward lane's first row, left to right, until the pointer is over a span: the
        // step's wall time can begin before its forward root (what ran between steps), so the root
        // is not always at the same pixel.
        var at = null, shown = false, text = '';
        for (var dx = 2; dx < r.width && !shown; dx += 4) {
          at = {clientX: r.left + dx, clientY: r.top + 22 + 18 + 6, bubbles: true};
          flame.dispatchEvent(new MouseEvent('mousemove', at));
          shown = !tip.hidden;
          text = tip.textContent;
        }
        flame.dispatchEvent(new MouseEvent('click', at));
        var select = document.getElementById('step-select');
        select.value = '0';
        select.dispatchEvent(new Event('change'));
        return {shown: shown, text: text, selected: select.options[select.selectedIndex].text, hiddenAfter: tip.hidden};
        """
    )
    assert after["shown"] and after["text"].startswith("TinyLM\nforward"), after
    assert after["selected"].startswith("step 0: step time ") and ", wall time " in after["selected"] and after["hiddenAfter"]
    log = browser.browser_log()
    errors = [e for e in log if e.get("level") in ("SEVERE", "ERROR")]
    assert errors == [], errors
    assert state["rendered"] == "true"
    assert state["title"] == "modtrace report: slow"
    assert state["canvas"][0] > 400 and state["canvas"][1] > 100
    assert state["painted"] > 0.2 * state["canvas"][0] * state["canvas"][1]  # the flame chart is drawn
    assert state["steps"] == 3 and state["options"] == 3
    assert state["diffShown"] and state["timingRows"] > 0
    assert state["modules"] > 5
    assert "early_stop" in state["issuesText"]  # checkpoint recompute shows its info issues
    assert state["resources"] == []  # nothing was fetched

    shot = browser.screenshot()
    (tmp_path / "report.png").write_bytes(shot)
    if os.environ.get("MODTRACE_KEEP_SCREENSHOT"):
        Path(os.environ["MODTRACE_KEEP_SCREENSHOT"]).write_bytes(shot)
    width, height = png_size(shot)
    assert width >= 1000 and height >= 600, (width, height)
    assert len(shot) > 20_000, len(shot)


# -- laptop width ------------------------------------------------------------------------


class LongNamedBlock(nn.Module):
    """Names as long as a Hugging Face decoder layer's; ``clock`` charges ``cost_ns`` to the projection."""

    def __init__(self, clock: StepClock, cost_ns: int) -> None:
        super().__init__()
        self.self_attention_projection = nn.Linear(8, 8)
        self.post_attention_layernorm = nn.LayerNorm(8)
        self.feed_forward_network = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
        self.clock, self.cost_ns = clock, cost_ns

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.post_attention_layernorm(x + self.self_attention_projection(x))
        self.clock.add(self.cost_ns)
        return x + self.feed_forward_network(x)


class LongNamedModelForCausalLanguageModeling(nn.Module):
    def __init__(self, clock: StepClock, slow_ns: int) -> None:
        super().__init__()
        self.transformer_backbone = nn.ModuleDict({
            "decoder_layers": nn.ModuleList([LongNamedBlock(clock, 20_000), LongNamedBlock(clock, 20_000 + slow_ns)]),
        })
        self.language_modeling_head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.transformer_backbone["decoder_layers"]:
            x = layer(x)
        return self.language_modeling_head(x)


def record_long_names(db: str, run: str, slow_ns: int = 0) -> None:
    clock = StepClock()
    torch.manual_seed(0)
    model = LongNamedModelForCausalLanguageModeling(clock, slow_ns)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with modtrace.Recorder(db=db, run=run, clock=clock) as rec:
        for _ in range(12):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
    rec.wait_analyzed()


# Per table cell: its characters' line boxes (one Range per character) and where a line breaks;
# a break may fall at a space or after a dot, slash or comma (between a name's or a path's parts),
# never between two letters or digits: inside a word.
LAYOUT_JS = """
var out = {innerWidth: window.innerWidth, pageWidth: document.documentElement.scrollWidth,
           overflowing: [], badBreaks: [], cells: 0, wrapped: 0};
document.querySelectorAll('.scroll, table').forEach(function (box) {
  if (box.scrollWidth > box.clientWidth + 1) out.overflowing.push((box.closest('section') || {}).id + ' ' + box.tagName);
});
var range = document.createRange();
document.querySelectorAll('td, th').forEach(function (cell) {
  if (!cell.offsetParent) return;  // hidden
  out.cells++;
  if (cell.scrollWidth > cell.clientWidth + 1) out.overflowing.push('cell ' + cell.textContent);
  var walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
  var prev = null, lines = 1, node;
  while ((node = walker.nextNode())) {
    for (var i = 0; i < node.data.length; i++) {
      range.setStart(node, i); range.setEnd(node, i + 1);
      var rect = range.getClientRects()[0];
      if (!rect) continue;  // a space collapsed at the end of a line
      if (prev && rect.top > prev.top + rect.height / 2) {
        lines++;
        var before = prev.ch, here = node.data[i];
        if (/[\\p{L}\\p{N}_]/u.test(before) && /[\\p{L}\\p{N}_]/u.test(here)) {
          out.badBreaks.push(cell.textContent + ' | ' + before + '/' + here);
        }
      }
      prev = {top: rect.top, ch: node.data[i]};
    }
  }
  if (lines > 1) out.wrapped++;
});
return out;
"""


def test_report_fits_a_laptop_window_and_wraps_between_words_only(browser: WebDriver, tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = str(tmp_path / "long.db")
    record_long_names(db, "base")
    record_long_names(db, "slow", slow_ns=100_000)
    page = tmp_path / "report.html"
    assert run_cli("report", "slow", "--vs", "base", "--db", db, "-o", str(page)).code == 0
    doc = json.loads(run_cli("diff", "base", "slow", "--db", db, "--format", "json").out)

    seen = {}
    for width in (900, 1400):
        browser.call("POST", browser.s("/window/rect"), {"width": width, "height": 1000})
        browser.navigate(page.as_uri())
        seen[width] = layout = browser.execute(LAYOUT_JS)
        assert layout["innerWidth"] == width, layout["innerWidth"]
        assert layout["pageWidth"] <= width, f"the page scrolls sideways at {width} px: {layout['pageWidth']}"
        assert layout["overflowing"] == [], (width, layout["overflowing"])
        assert layout["badBreaks"] == [], (width, layout["badBreaks"][:10])
        assert layout["cells"] > 200
    assert seen[900]["wrapped"] > seen[1400]["wrapped"]  # the check saw lines break, at allowed points

    names = browser.execute(
        """
        var cells = Array.from(document.querySelectorAll('td.fqn'));
        var heads = Array.from(document.querySelectorAll('#diff-timing table'))[0].querySelectorAll('th');
        var reg = document.querySelector('#diff-timing tr.regression');
        return {
          note: document.getElementById('prefix-note').textContent,
          cells: cells.map(function (c) { return [c.textContent, c.title]; }),
          headers: Array.from(heads).map(function (h) { return h.textContent; }),
          regression: Array.from(reg.children).map(function (c) { return c.textContent; }),
        };
        """
    )
    prefix = "LongNamedModelForCausalLanguageModeling"
    assert f"leave out the prefix {prefix}. " in names["note"]
    assert len(names["cells"]) > 30
    for text, title in names["cells"]:
        # the whole name on hover, the name without the shared prefix in the cell
        assert title == text or title == f"{prefix}.{text}", (text, title)
        assert not text.startswith(prefix + ".")
    # The diff's table is modtrace diff's: same headers, and its p is the Holm-adjusted one.
    assert tuple(names["headers"]) == TIMING_HEADERS
    row = next(r for r in doc["timing"] if r["verdict"] == "regression")
    assert names["regression"][0] == row["fqn"].removeprefix(prefix + ".")
    assert names["regression"][TIMING_HEADERS.index("p (Holm)")] == fmt_p(row["self"]["p_adjusted"])
    assert fmt_p(row["self"]["p_adjusted"]) != fmt_p(row["self"]["p_value"])


# -- the trend charts of the blamed modules ---------------------------------------------

TREND_JS = """
var svgs = Array.from(document.querySelectorAll('#diff-trend svg.trend'));
return {
  rendered: document.body.getAttribute('data-rendered'),
  charts: svgs.map(function (svg) {
    return {
      fqn: svg.getAttribute('data-fqn'), phase: svg.getAttribute('data-phase'),
      width: svg.getBoundingClientRect().width, height: svg.getBoundingClientRect().height,
      line: svg.querySelector('polyline').getAttribute('points').trim().split(/\\s+/).length,
      dots: Array.from(svg.querySelectorAll('circle')).map(function (c) {
        return {role: c.getAttribute('class'), run: c.getAttribute('data-run'), us: Number(c.getAttribute('data-us')),
                cx: Number(c.getAttribute('cx')), cy: Number(c.getAttribute('cy')), title: c.textContent};
      }),
      caption: svg.parentNode.querySelector('figcaption').textContent,
    };
  }),
};
"""


def test_trend_chart_draws_each_blamed_module_across_the_runs(browser: WebDriver, tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    from tests.helpers.report import record_toy

    db = str(tmp_path / "t.db")
    record_toy(db, "base", steps=8)
    record_toy(db, "slow", steps=8, slow_ns=400_000)  # the injected clock charges Toy.body.2 400 us per call
    page = tmp_path / "report.html"
    assert run_cli("report", "slow", "--vs", "base", "--db", db, "-o", str(page)).code == 0

    browser.navigate(page.as_uri())
    got = browser.execute(TREND_JS)
    assert got["rendered"] == "true"
    assert [(c["fqn"], c["phase"]) for c in got["charts"]] == [("Toy.body.2", "forward")]
    chart = got["charts"][0]
    assert chart["caption"] == "body.2 forward"  # without the prefix every name shares
    assert chart["width"] > 100 and chart["height"] > 50
    base, cand = chart["dots"]
    assert (base["role"], base["run"], cand["role"], cand["run"]) == ("trend-base", "base", "trend-cand", "slow")
    assert cand["us"] - base["us"] == 400
    assert cand["cx"] > base["cx"] and cand["cy"] < base["cy"]  # later, and higher: slower
    assert chart["line"] == 2 and cand["title"].startswith("slow (candidate): ")

    # Against a history of three baseline runs (report --vs tag:...): four points, oldest first,
    # the candidate last and drawn in its own colour, each run's time the diff's.
    hostile = 'm"><b>1</b>'  # a run name is text, never markup
    record_toy(db, hostile, steps=8, tags={"branch": "main"})
    record_toy(db, "main-2", steps=8, tags={"branch": "main"})
    record_toy(db, "main-3", steps=8, tags={"branch": "main"})
    history_page = tmp_path / "history.html"
    res = run_cli("report", "slow", "--vs", "tag:branch=main", "--db", db, "-o", str(history_page))
    assert res.code == 0, res.err
    browser.navigate(history_page.as_uri())
    got = browser.execute(TREND_JS)
    # the slower block slowed the whole step beyond the history's (identical) runs too: a
    # step-wide regression, charted first
    assert [(c["fqn"], c["phase"]) for c in got["charts"]] == [("step time", "whole step"), ("Toy.body.2", "forward")]
    step_dots, dots = got["charts"][0]["dots"], got["charts"][1]["dots"]
    assert [d["run"] for d in dots] == [d["run"] for d in step_dots] == [hostile, "main-2", "main-3", "slow"]
    assert browser.execute("return document.querySelectorAll('#diff-trend b').length;") == 0
    assert [d["role"] for d in dots] == ["trend-base"] * 3 + ["trend-cand"]
    assert [d["cx"] for d in dots] == sorted(d["cx"] for d in dots)
    assert min(dots, key=lambda d: d["cy"])["run"] == "slow"
    diff = json.loads(run_cli("diff", "tag:branch=main", "slow", "--db", db, "--format", "json").out)
    assert diff["step"]["verdict"] == "regression"
    row = next(r for r in diff["timing"] if r["fqn"] == "Toy.body.2" and r["phase"] == "forward")
    assert [d["us"] for d in dots] == [*reversed(row["self"]["history_us"]), row["self"]["cand_us"]]
    assert [d["us"] for d in step_dots] == [*(h["step_us"] for h in reversed(diff["base"]["history"])),
                                            diff["cand"]["step_us"]]
    errors = [e for e in browser.browser_log() if e.get("level") in ("SEVERE", "ERROR")]
    assert errors == [], errors
