"""Curves over rollout steps (``store/_plots.py``): the data from a crafted store, exactly; the
SVG drawn from it (well-formed, labels escaped, gaps); ``episodes --plots`` and its refusals."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from miles_nemogym.store._browser import summary_rows
from miles_nemogym.store._plots import Plot, Series, plots, plots_html, svg
from miles_nemogym.store.views import load
from tests.support.episode_stores import build_env_store
from tests.support.hostile_store import entry, write_step
from tests.support.plot_store import ODD_KIND, ODD_SET

SVG = "{http://www.w3.org/2000/svg}"


def invoke(*args: str | Path) -> Any:
    return CliRunner().invoke(app, ["episodes", *map(str, args)])


def test_plot_data_from_a_crafted_store(plot_store: Path) -> None:
    assert plots(load(plot_store).episodes) == [
        Plot("train-reward-resolve-rate", "train: reward mean and resolve rate (valid episodes)", "reward", (1, 2, 4), (
            Series("reward mean", (2 / 3, None, 2 / 3)),  # step 2 has no valid episode; "x" is no reward
            Series("resolve rate", (2 / 3, None, 3 / 4)),
        )),
        Plot("train-failure-rate", "train: failure rate (set-aside episodes) by kind", "rate", (1, 2, 4), (
            Series("all kinds", (1 / 4, 1.0, 0.0)),
            Series(ODD_KIND, (0.0, 0.5, 0.0)),
            Series("agent_run_error", (0.25, 0.0, 0.0)),
            Series("agent_timeout", (0.0, 0.5, 0.0)),
        )),
        # Nearest rank over sent episodes (valid or not): [5, 10, 20, 30], [40], [12, 14, 100].
        Plot("train-episode-time", "train: episode time percentiles", "s", (1, 2, 4), (
            Series("p50", (10.0, 40.0, 14.0)),
            Series("p95", (30.0, 40.0, 100.0)),
            Series("max", (30.0, 40.0, 100.0)),
        )),
        Plot("eval-_b_lite____b_-pass-at-k", f"eval {ODD_SET}: pass@1", "rate", (4,), (Series("pass@1", (1.0,)),)),
        # Step 2: A 1 of 4 resolved, B 1 of 3 valid (one set aside: short of k=4 for pass@4);
        # step 4: A 0 of 4, B 2 of 4: pass@4 = (0 + (1 - C(2,4)/C(4,4))) / 2.
        Plot("eval-verified-pass-at-k", "eval verified: pass@1 and pass@4", "rate", (2, 4), (
            Series("pass@1", ((1 / 4 + 1 / 3) / 2, (0 + 2 / 4) / 2)),
            Series("pass@4", (1.0, 0.5)),
        )),
    ]  # fmt: skip


def test_pass_at_k_varies_with_the_samples_per_step(tmp_path: Path) -> None:
    """k is the samples per instance of each step; pass@k is None where no instance has k valid."""
    ep = tmp_path / "ep"
    two: list[dict[str, Any] | str] = [
        entry(f"a{i}", role="eval", eval_set="s", record={"resolved": i == 0}) for i in range(2)
    ]
    three = [entry(f"b{i}", role="eval", eval_set="s", record={"resolved": i == 1}) for i in range(3)]
    masked = entry("b3", role="eval", eval_set="s", record={"mask_sample": True, "failure_kind": "agent_timeout"})
    write_step(ep, "eval", 1, two)
    write_step(ep, "eval", 2, [*three, masked])  # 4 samples, 3 valid: short of k
    (plot,) = plots(load(ep).episodes)
    assert plot.series == (
        Series("pass@1", (0.5, 1 / 3)),
        Series("pass@k (k per step: 2, 4)", (1.0, None)),
    )


def test_the_resolve_rate_curve_counts_what_the_table_counts(tmp_path: Path) -> None:
    """A hand-edited ``resolved`` of the wrong type is not a resolve in the table: nor on the curve."""
    ep = tmp_path / "ep"
    write_step(ep, "train", 1, [entry("a", record={"resolved": "false"}), entry("b", record={"resolved": False})])
    episodes = load(ep).episodes
    (row,) = summary_rows(episodes)
    (quality, *_) = plots(episodes)
    assert row.pass_rate == 0.0
    assert quality.series[1] == Series("resolve rate", (0.0,))


def _parsed(plot: Plot) -> ET.Element:
    return ET.fromstring(svg(plot))


def test_svgs_are_well_formed_with_every_label_escaped(plot_store: Path) -> None:
    drawn = plots(load(plot_store).episodes)
    roots = {p.name: _parsed(p) for p in drawn}
    assert all(root.tag == SVG + "svg" for root in roots.values())
    odd = roots["eval-_b_lite____b_-pass-at-k"]
    # The markup in the set's name is text after parsing, not elements.
    assert odd.get("aria-label") == f"eval {ODD_SET}: pass@1"
    assert odd.find(SVG + "title").text == f"eval {ODD_SET}: pass@1"  # type: ignore[union-attr]
    failures = roots["train-failure-rate"]
    drawn_with = ("svg", "title", "rect", "text", "line", "polyline", "circle")
    assert {e.tag for e in failures.iter()} <= {SVG + tag for tag in drawn_with}
    texts = ["".join(t.itertext()) for t in failures.iter(SVG + "text")]
    assert f"{ODD_KIND}: latest 0% (step 4)" in texts
    assert "rollout step" in texts and "rate (%)" in texts and "100%" in texts
    # Store text with control characters, a lone surrogate or a non-character is still XML.
    name = "a\x1b[2Jb\x07\ud800\uffff<c>"
    plot = Plot("x", name, "rate", (1,), (Series(name, (0.5,)),))
    assert _parsed(plot).get("aria-label") == "ab\ufffd\ufffd<c>"


def test_a_step_with_no_valid_episode_is_a_gap_and_one_step_renders(plot_store: Path) -> None:
    quality = _parsed(plots(load(plot_store).episodes)[0])
    # Steps 1 and 4 each a point; step 2 a grey band saying so, no line through it.
    assert len(quality.findall(SVG + "circle")) == 4 and quality.findall(SVG + "polyline") == []
    (band,) = [r for r in quality.findall(SVG + "rect") if r.findtext(SVG + "title")]
    assert band.findtext(SVG + "title") == "step 2: no valid episodes"
    times = _parsed(plots(load(plot_store).episodes)[2])
    assert len(times.findall(SVG + "polyline")) == 3  # unbroken: every step has a time
    single = _parsed(plots(load(plot_store).episodes)[3])  # one step: one point, mid-axis
    (point,) = single.findall(SVG + "circle")
    assert float(point.get("cx", "")) == pytest.approx(56 + (560 - 56 - 16) / 2)
    assert point.findtext(SVG + "title") == "pass@1 step 4: 100%"


def test_page_inlines_the_plots_without_naming_a_url(plot_store: Path) -> None:
    page = plots_html(load(plot_store).episodes)
    assert page.count('<div class="plot"><svg width=') == 5 and "http" not in page and "<script" not in page
    assert plots_html([]) == "<p>No rollout step sealed yet: nothing to plot over steps.</p>"


def test_cli_writes_one_svg_per_plot(plot_store: Path, tmp_path: Path) -> None:
    out = tmp_path / "plots"
    result = invoke(plot_store, "--plots", out)
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(f"{p.name}.svg" for p in plots(load(plot_store).episodes)) and len(names) == 5
    for path in out.iterdir():
        text = path.read_text(encoding="utf-8")
        assert text.startswith('<?xml version="1.0" encoding="UTF-8"?>\n<svg xmlns=')
        assert ET.fromstring(text.encode()).tag == SVG + "svg"
    assert f"wrote 5 plots to {out}: train-reward-resolve-rate.svg" in result.output
    # Filters apply: train step 1 only.
    again = invoke(plot_store, "--plots", tmp_path / "one", "--step", "1")
    assert again.exit_code == 0, again.output
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == [
        "train-episode-time.svg", "train-failure-rate.svg", "train-reward-resolve-rate.svg"
    ]  # fmt: skip


def test_cli_plots_with_the_page_and_with_nothing_sealed(plot_store: Path, tmp_path: Path) -> None:
    result = invoke(plot_store, "--plots", tmp_path / "p", "--html", tmp_path / "page.html")
    assert result.exit_code == 0, result.output
    assert len(list((tmp_path / "p").iterdir())) == 5 and (tmp_path / "page.html").is_file()
    pending = tmp_path / "pending"
    (pending / "train").mkdir(parents=True)
    (pending / "train" / "pending-1-ab-1.jsonl").write_text(json.dumps(entry("p")) + "\n")
    none = invoke(pending, "--plots", tmp_path / "none")
    assert none.exit_code == 0 and "no rollout step sealed yet" in none.output
    assert not (tmp_path / "none").exists()


def test_cli_refuses_plots_targets_as_it_refuses_page_targets(plot_store: Path, tmp_path: Path) -> None:
    def refused(target: Path, says: str) -> None:
        result = invoke(plot_store, "--plots", target)
        assert result.exit_code == 2 and f"error: --plots {target}" in result.output and says in result.output

    refused(plot_store / "plots", "inside the episode store")
    (tmp_path / "into-store").symlink_to(plot_store / "train")
    refused(tmp_path / "into-store", "inside the episode store")
    (tmp_path / "a-file").write_text("x")
    refused(tmp_path / "a-file", "is not a folder")
    refused(tmp_path / "missing" / "plots", "does not exist")
    # A link at a file name inside the folder is neither followed nor replaced.
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (out / "train-failure-rate.svg").symlink_to(victim)
    result = invoke(plot_store, "--plots", out)
    assert result.exit_code == 2 and "is a symbolic link" in result.output
    assert victim.read_text() == "keep" and os.path.islink(out / "train-failure-rate.svg")
    assert list(plot_store.rglob("*.svg")) == []


def test_plots_per_environment(tmp_path: Path) -> None:
    """Train reward per environment, the resolve rate over SWE episodes only, and each
    environment's pass@1 beside an eval set's (a pass: resolved, or full credit)."""
    drawn = {p.name: p for p in plots(load(build_env_store(tmp_path / "ep")).episodes)}
    assert list(drawn) == [
        "train-reward-resolve-rate", "train-reward-per-environment", "train-failure-rate", "train-episode-time",
        "eval-mixed-pass-at-k",
    ]  # fmt: skip
    # Step 1: rewards 1, 0 (SWE), 1, 0 (mcqa), 0.5 (workplace_assistant); step 2: mcqa and workplace_assistant.
    assert drawn["train-reward-resolve-rate"].series == (
        Series("reward mean", (0.5, 1.0)),
        Series("SWE resolve rate", (0.5, None)),  # s1 of s1, s2; step 2 has no SWE episode
    )
    assert drawn["train-reward-per-environment"].series == (
        Series("mcqa", (0.5, 1.0)),
        Series("swe", (0.5, None)),
        Series("workplace_assistant", (0.5, 1.0)),
    )
    assert drawn["eval-mixed-pass-at-k"].series == (
        Series("pass@1", (0.5,)),
        Series("pass@2", (1.0,)),
        Series("pass@1 mcqa", (0.5,)),
        Series("pass@1 swe", (0.5,)),
    )
    ET.fromstring(svg(drawn["train-reward-per-environment"]))  # well-formed


def test_an_environment_only_store_has_no_resolve_rate(tmp_path: Path) -> None:
    write_step(tmp_path / "ep", "train", 1, [
        entry("a", record={"environment": "mcqa", "resolved": None}, reward=1.0),
        entry("b", record={"environment": "mcqa", "resolved": None}, reward=0.0),
    ])  # fmt: skip
    (quality, *_) = plots(load(tmp_path / "ep").episodes)
    assert quality.title == "train: reward mean (valid episodes)"
    assert quality.series == (Series("reward mean", (0.5,)),)


def _labels(root: ET.Element) -> list[tuple[str, float, float]]:
    """The value labels drawn next to points (haloed text): (text, x, y)."""
    return [
        ("".join(t.itertext()), float(t.get("x", "0")), float(t.get("y", "0")))
        for t in root.iter(SVG + "text")
        if t.get("stroke") == "#fff"
    ]


def test_one_step_draws_each_time_label_once(tmp_path: Path) -> None:
    """One step of equal times: p50, p95 and max are one point, so "34 s" is written once, not
    three times on top of each other; the legend still names each series."""
    ep = tmp_path / "ep"
    write_step(ep, "train", 1, [entry("a", record={"elapsed_s": 34.0})])
    out = tmp_path / "plots"
    assert invoke(ep, "--plots", out).exit_code == 0
    root = ET.fromstring((out / "train-episode-time.svg").read_bytes())
    assert [text for text, _, _ in _labels(root)] == ["34 s"]
    texts = ["".join(t.itertext()) for t in root.iter(SVG + "text")]
    assert {"p50: latest 34 s (step 1)", "p95: latest 34 s (step 1)", "max: latest 34 s (step 1)"} <= set(texts)


def test_distinct_labels_of_one_step_never_overlap() -> None:
    plot = Plot("t", "times", "s", (1,), (Series("p50", (34.0,)), Series("p95", (35.0,)), Series("max", (35.4,))))
    labels = _labels(_parsed(plot))
    assert sorted(text for text, _, _ in labels) == ["34 s", "35 s"]  # 35.4 s reads "35 s" too: once
    (_, x1, y1), (_, x2, y2) = labels
    assert x1 == x2 and abs(y1 - y2) >= 11  # a line apart: font-size 10


def test_a_newline_inside_an_escape_sequence_ends_it_and_the_text_after_it_stays() -> None:
    plot = Plot("p", "title\x1b]0;t\nkept", "rate", (1,), (Series("x\x1b[\nA", (0.5,)),))
    drawn = svg(plot)
    assert "title kept" in drawn and "x A" in drawn
