"""The ``--html`` page as a person sees it, rendered by a real headless Chromium.

Runs whenever a Chromium binary is on PATH (Debian's ``chromium``; ``.ci/run`` installs
it). A measuring script is added to a copy of the page (the page itself has none) and
its findings are read back from ``--dump-dom``: the table's rows, each chart's size and
bars, what an expanded episode shows, and every resource the page loaded.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import struct
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from tests.support.episode_stores import build_store
from tests.support.hostile_store import entry, run_answer, write_step
from tests.support.plot_store import ODD_KIND, ODD_SET, build_plot_store

CHROMIUM = next(
    (path for name in ("chromium", "chromium-browser", "google-chrome") if (path := shutil.which(name))), None
)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium)")

WIDTH, HEIGHT = 1280, 1800

# Runs at the load event, when every resource the page asked for has been fetched.
_MEASURE = """<script>
addEventListener('load', () => {
  const box = e => { const r = e.getBoundingClientRect(); return [Math.round(r.width), Math.round(r.height)]; };
  const first = document.querySelector('body > details');
  const body = first.querySelector('div.episode');
  const seen = {
    rows: [...document.querySelectorAll('table tr')].map(tr => [...tr.cells].map(c => c.innerText.trim())),
    charts: [...document.querySelectorAll('div.chart > svg')].map(svg => ({
      label: svg.getAttribute('aria-label'), box: box(svg),
      bars: [...svg.querySelectorAll('rect')].map(r => ({box: box(r), fill: getComputedStyle(r).fill})),
      values: [...svg.querySelectorAll('text')].map(t => t.textContent.replace(/\\s+/g, ' ').trim()),
    })),
    summaries: [...document.querySelectorAll('body > details > summary')].map(s => s.innerText.trim()),
    closed: [box(first), body.checkVisibility()],
    overflow: document.documentElement.scrollWidth - innerWidth,
  };
  first.open = true;
  seen.opened = [box(first), body.checkVisibility()];
  seen.openedText = body.innerText;
  seen.resources = performance.getEntriesByType('resource').map(e => e.name);
  document.body.setAttribute('data-seen', JSON.stringify(seen));
});
</script></body>"""

# For a page of crafted episodes: did anything in it run or load, and what does a person see
# of each episode when it is opened (its long parts' "show all" still closed), then opened?
_MEASURE_CRAFTED = """<script>
addEventListener('load', () => {
  const episodes = [...document.querySelectorAll('body > details')];
  episodes.forEach(d => { d.open = true; });
  const seen = {
    pwned: document.documentElement.dataset.pwned || null,
    title: document.title,
    active: [...document.querySelectorAll('script, img, iframe, object, embed, meta, link, [onload], [onerror]')]
      .map(e => e.tagName),
    summaries: episodes.map(d => d.querySelector('summary').innerText.trim()),
    texts: episodes.map(d => (d.querySelector('div.episode') || d).innerText),
    more: [...document.querySelectorAll('details.more')].map(d => [d.open, d.querySelector('summary').innerText]),
    overflow: document.documentElement.scrollWidth - innerWidth,
  };
  document.querySelectorAll('details.more').forEach(d => { d.open = true; });
  seen.allTexts = episodes.map(d => (d.querySelector('div.episode') || d).innerText);
  seen.resources = performance.getEntriesByType('resource').map(e => e.name);
  document.body.setAttribute('data-seen', JSON.stringify(seen));
});
</script></body>"""

# For a page with plots over rollout steps: each plot's size, painted lines and points, texts.
_MEASURE_PLOTS = """<script>
addEventListener('load', () => {
  const box = e => { const r = e.getBoundingClientRect(); return [Math.round(r.width), Math.round(r.height)]; };
  const seen = {
    scripts: document.scripts.length,
    pwned: document.documentElement.dataset.pwned || null,
    plots: [...document.querySelectorAll('div.plot > svg')].map(svg => ({
      label: svg.getAttribute('aria-label'), box: box(svg),
      lines: [...svg.querySelectorAll('polyline')].map(l => [getComputedStyle(l).stroke, box(l)]),
      points: [...svg.querySelectorAll('circle')].map(c => box(c)),
      texts: [...svg.querySelectorAll(':scope > text')].map(t => t.textContent),
      elements: [...svg.querySelectorAll('*')].filter(e => !['title', 'rect', 'text', 'line', 'polyline',
        'circle'].includes(e.tagName)).map(e => e.tagName),
    })),
    overflow: document.documentElement.scrollWidth - innerWidth,
  };
  seen.resources = performance.getEntriesByType('resource').map(e => e.name);
  document.body.setAttribute('data-seen', JSON.stringify(seen));
});
</script></body>"""


def chromium(tmp_path: Path, url: str, *args: str) -> str:
    """Chromium's stdout for ``url``, headless, with a throw-away profile and home (else it
    writes ~/.config/chromium and ~/.cache/dconf: no test writes outside its own folder)."""
    home = tmp_path / "home"
    environ = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
               "XDG_CACHE_HOME": str(home / ".cache")}  # fmt: skip
    done = subprocess.run(
        [CHROMIUM or "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
         f"--window-size={WIDTH},{HEIGHT}", *args, url],
        capture_output=True, text=True, timeout=120, check=False, env=environ,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def seen_in(tmp_path: Path, page: Path, extra_html: str = "", measure: str = _MEASURE) -> dict[str, Any]:
    """What the ``measure`` script found in a copy of ``page`` (plus ``extra_html``)."""
    probe = tmp_path / f"probe-{page.name}"
    text = page.read_text()
    assert text.count("</body>") == 1
    probe.write_text(text.replace("</body>", extra_html + measure), encoding="utf-8")
    dom = chromium(tmp_path, probe.as_uri(), "--dump-dom", "--virtual-time-budget=5000")
    match = re.search(r'data-seen="([^"]*)"', dom)
    assert match, "the measuring script did not run: " + dom[:500]
    seen: dict[str, Any] = json.loads(html.unescape(match.group(1)))
    return seen


@pytest.fixture
def page(tmp_path: Path, gym_example_rollouts: list[dict[str, Any]]) -> Path:
    build_store(tmp_path / "ep", gym_example_rollouts)
    out = tmp_path / "episodes.html"
    result = CliRunner().invoke(app, ["episodes", str(tmp_path / "ep"), "--html", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def pixel_server() -> Iterator[tuple[str, list[str]]]:
    """A loopback HTTP server that answers any GET with an image and logs the paths."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            body = b"<svg xmlns='http://www.w3.org/2000/svg' width='1' height='1'/>"
            self.send_response(200)
            self.send_header("Content-Type", "image/svg+xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()


def test_page_shows_table_charts_and_expandable_episodes(
    page: Path, tmp_path: Path, gym_example_rollouts: list[dict[str, Any]]
) -> None:
    seen = seen_in(tmp_path, page)
    n = len(gym_example_rollouts)
    resolved = sum(1 for r in gym_example_rollouts if r["reward"] == 1.0)
    assert seen["rows"] == [
        ["role", "step", "episodes", "valid", "resolve rate", "failures by kind", "mean turns", "mean time s"],
        ["eval", "1", "2", "2", "100.0%", "-", "3.0", "30.0"],
        ["train", "1", str(n + 1), str(n), f"{resolved / n:.1%}", "agent_run_error 1", "3.0",
         f"{(30.0 * n + 2.0) / (n + 1):.1f}"],
        ["train", "pending", "1", "1", "0.0%", "-", "3.0", "30.0"],
    ]  # fmt: skip
    charts = {chart["label"]: chart for chart in seen["charts"]}
    assert list(charts) == [
        "train: resolve rate (valid episodes) per step",
        "train: failed episodes by kind per step",
        "eval: resolve rate (valid episodes) per step",
        "eval: failed episodes by kind per step (none failed)",
    ]
    assert all(chart["box"] == [520, 220] for chart in charts.values())
    # Bars a person sees: non-zero size, in the series' colour, labelled with their value.
    train_rate = charts["train: resolve rate (valid episodes) per step"]
    (bar,) = train_rate["bars"]  # step 1; the pending step's 0% has no bar, only its label
    assert bar["fill"] == "rgb(44, 160, 44)" and bar["box"][0] > 0 and bar["box"][1] == round(resolved / n * 156)
    assert train_rate["values"][-4:] == [f"{resolved / n:.0%}", "1", "0%", "pending"]
    (failed,) = charts["train: failed episodes by kind per step"]["bars"]
    assert failed["fill"] == "rgb(214, 39, 40)" and failed["box"][1] == 156  # 1 of at most 1
    assert charts["eval: resolve rate (valid episodes) per step"]["bars"][0]["box"][1] == 156  # 100%
    assert charts["eval: failed episodes by kind per step (none failed)"]["bars"] == []
    # Every episode is one collapsed line; opened, it shows the --show view.
    assert len(seen["summaries"]) == 9
    assert seen["summaries"][0].startswith("eval/verified step 1 · " + gym_example_rollouts[0]["instance_id"])
    (closed_w, closed_h), closed_visible = seen["closed"]
    (opened_w, opened_h), opened_visible = seen["opened"]
    assert closed_visible is False and opened_visible is True
    assert closed_w == opened_w > 1000 and closed_h < 40 and opened_h > 1000  # one line, then the whole episode
    assert seen["openedText"].startswith("episode eval0   instance " + gym_example_rollouts[0]["instance_id"])
    assert "--- turn 1\nthought:" in seen["openedText"] and "--- test report" in seen["openedText"]
    assert seen["overflow"] == 0  # nothing wider than the window
    assert seen["resources"] == []  # self-contained: not one request


def test_the_resource_check_sees_a_request_when_there_is_one(
    page: Path, tmp_path: Path, pixel_server: tuple[str, list[str]]
) -> None:
    base, hits = pixel_server
    seen = seen_in(tmp_path, page, f'<img src="{base}/pixel.svg" alt="">')
    assert seen["resources"] == [f"{base}/pixel.svg"] and hits == ["/pixel.svg"]


@pytest.mark.parametrize("fixture", ["page", "plot_page"])
def test_screenshot_of_the_page(fixture: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    shot = tmp_path / "episodes.png"
    chromium(tmp_path, request.getfixturevalue(fixture).as_uri(), f"--screenshot={shot}")
    header = shot.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", header[16:24]) == (WIDTH, HEIGHT)


def test_crafted_store_content_runs_and_loads_nothing(tmp_path: Path, pixel_server: tuple[str, list[str]]) -> None:
    from miles_nemogym.store._page import INLINE_CHARS

    base, hits = pixel_server

    def payload(field: str) -> str:
        """Markup that, if the page let it through, loads ``/<field>.png`` or marks the page."""
        mark = f"document.documentElement.dataset.pwned='{field}'"
        return (
            f'<img src="{base}/{field}.png" onload="{mark}"><script>{mark}</script>'
            f'<svg onload="{mark}"></svg><meta http-equiv="refresh" content="0;url={base}/{field}-refresh">'
        )

    answer = run_answer(
        [
            {"type": "message", "content": [{"text": payload("thought")}]},
            {"type": "function_call", "arguments": {"command": payload("command")}},
            {"type": "function_call_output", "output": payload("output")},
        ],
        patch=(patch := payload("patch") + "".join(f"+line {i}\n" for i in range(300_000))),
        report={"resolved": payload("resolved"), "tests_status": {"FAIL_TO_PASS": {"failure": [payload("test")]}}},
        instance=payload("instance"),
    )
    crafted = entry(
        "crafted" + payload("id"),
        answer,
        instance_id=payload("instance"),
        eval_set=payload("set"),
        session_id=payload("session"),
        reward=payload("reward"),
        record={"turns": payload("turns"), "elapsed_s": payload("time"), "attempts": payload("n")},
    )
    masked = entry(
        "masked",
        {"text": payload("answer")},
        reward=0.0,
        record={
            "mask_sample": True,
            "failure_kind": payload("kind"),
            "failure_reason": payload("reason"),
            "tool_calls": payload("calls"),
        },
    )
    store = tmp_path / "<svg onload=document.documentElement.dataset.pwned=1>"  # the folder's name is in the title
    write_step(store, "train", 1, [crafted, masked, '{"episode_id": "cut by a cr'])  # also named as a cut file
    write_step(store, "eval", 1, [{**crafted, "episode_id": "eval"}])
    page = tmp_path / "page.html"
    result = CliRunner().invoke(app, ["episodes", str(store), "--html", str(page)])
    assert result.exit_code == 0, result.output

    seen = seen_in(tmp_path, page, measure=_MEASURE_CRAFTED)
    assert seen["pwned"] is None and hits == [] and seen["resources"] == []
    assert seen["active"] == ["META", "SCRIPT"]  # the page's charset and the measuring script
    assert seen["title"] == f"Episodes in {store}"
    # Each summary field is cut at 200 characters; the opened episode has them whole.
    assert seen["summaries"][1].startswith(f"train/{payload('set')[:199]}… step 1 · {payload('instance')[:199]}… ")
    assert " · resolved · reward - · turns " in seen["summaries"][1]  # no number: store.views.reward_text
    assert seen["summaries"][2].startswith(f"train step 1 · repo__x-1 · {payload('kind')[:199]}… · reward 0.0")
    opened = seen["texts"][1]
    for field in ("instance", "session", "turns", "thought", "command", "output"):
        assert payload(field) in opened, field
    assert "reward - " in opened and payload("reward") not in opened
    # The patch: its start shown, the rest of its 3.8 MB behind a closed "show all" (200,000
    # characters of it on the page).
    patch_start = opened.split("--- patch\n", 1)[1].split("show all (", 1)[0]
    assert patch_start.startswith(payload("patch") + "+line 0\n") and len(patch_start.strip()) <= INLINE_CHARS
    (closed, summary), *_ = seen["more"]
    more = int(summary.removeprefix("show all (").removesuffix(" more characters)").replace(",", ""))
    assert closed is False and len(patch) - INLINE_CHARS <= more < len(patch) - INLINE_CHARS * 3 // 4
    assert payload("reason") in seen["texts"][2] and payload("answer") in seen["texts"][2]
    assert len(seen["allTexts"][1]) - len(opened) > 190_000
    assert seen["overflow"] == 0


@pytest.fixture
def plot_page(tmp_path: Path) -> Path:
    store = build_plot_store(tmp_path / "ep")
    out = tmp_path / "plots.html"
    result = CliRunner().invoke(app, ["episodes", str(store), "--html", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_page_with_plots_draws_every_curve_and_runs_nothing(plot_page: Path, tmp_path: Path) -> None:
    seen = seen_in(tmp_path, plot_page, measure=_MEASURE_PLOTS)
    assert seen["scripts"] == 1 and seen["pwned"] is None  # the measuring script only
    assert seen["resources"] == [] and seen["overflow"] == 0
    plots = {plot["label"]: plot for plot in seen["plots"]}
    assert list(plots) == [
        "train: reward mean and resolve rate (valid episodes)",
        "train: failure rate (set-aside episodes) by kind",
        "train: episode time percentiles",
        f"eval {ODD_SET}: pass@1",
        "eval verified: pass@1 and pass@4",
    ]
    assert all(plot["elements"] == [] for plot in plots.values())  # the markup in labels is text
    assert all(plot["box"][0] == 560 and plot["box"][1] >= 270 for plot in plots.values())
    assert all(w == h == 6 for plot in plots.values() for w, h in plot["points"])  # every point painted
    # Step 2 has no valid episode: two points per curve, no line across the gap, a band saying so.
    quality = plots["train: reward mean and resolve rate (valid episodes)"]
    assert len(quality["points"]) == 4 and quality["lines"] == []
    assert {"no valid episodes", "rollout step", "value", "0.67", "0.75"} <= set(quality["texts"])
    # Every step measured: one line per kind, in its colour, spanning steps 1 to 4.
    failures = plots["train: failure rate (set-aside episodes) by kind"]
    assert [stroke for stroke, _ in failures["lines"]] == [
        "rgb(31, 119, 180)", "rgb(44, 160, 44)", "rgb(214, 39, 40)", "rgb(255, 127, 14)"
    ]  # fmt: skip
    assert all(w > 300 for _, (w, _) in failures["lines"])
    assert f"{ODD_KIND}: latest 0% (step 4)" in failures["texts"]
    assert {"100%", "50%", "25%", "rate (%)"} <= set(failures["texts"])
    times = plots["train: episode time percentiles"]
    assert {"p50: latest 14 s (step 4)", "max: latest 100 s (step 4)", "seconds"} <= set(times["texts"])
    single = plots[f"eval {ODD_SET}: pass@1"]
    assert len(single["points"]) == 1 and single["lines"] == [] and "pass@1: latest 100% (step 4)" in single["texts"]
    verified = plots["eval verified: pass@1 and pass@4"]
    assert len(verified["lines"]) == 2 and {"29.2%", "25%", "100%", "50%"} <= set(verified["texts"])
