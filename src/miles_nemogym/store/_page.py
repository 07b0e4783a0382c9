"""``miles-nemogym episodes --html``: one self-contained page (no scripts, no network) of tables,
charts, plots and every episode expandable to its ``--show`` view; every store value escaped. Pure."""

from __future__ import annotations

import html
from collections.abc import Callable

from miles_nemogym.episode.record import SWE_ENVIRONMENT
from miles_nemogym.store import ROLES
from miles_nemogym.store._browser import (
    PASS_RATE,
    SWE_RESOLVE_RATE,
    LongText,
    Row,
    cut_head,
    episode_parts,
    filed_label,
    quality_label,
    rate_name,
    row_cells,
    several_environments,
    step_label,
    summary_rows,
)
from miles_nemogym.store._plots import page_text, plots_html
from miles_nemogym.store._reader import Store, StoredEpisode, count_text, reward_text

__all__ = ["render_html"]

INLINE_CHARS = 1_000  # a long part of an episode shows this much, the rest behind "show all"
BLOCK_MAX_CHARS = 200_000  # at most this much of one part is on the page (the rest is counted)
_SUMMARY_FIELD_CHARS = 200

_KIND_COLOURS = ("#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")

_CSS = """
body{font:14px system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px}
table{border-collapse:collapse;margin:8px 0}th,td{border:1px solid #ccc;padding:4px 8px;text-align:left}
th{background:#f2f2f2}td.num{text-align:right}
details{border:1px solid #ddd;border-radius:4px;margin:4px 0;padding:4px 8px}
summary{cursor:pointer}details.more{border:0;padding:0 0 0 8px}
pre{background:#f7f7f7;padding:6px;white-space:pre-wrap;overflow-wrap:anywhere;margin:4px 0}
.resolved{color:#2ca02c;font-weight:600}.unresolved{color:#555}.failed{color:#d62728;font-weight:600}
.chart{display:inline-block;vertical-align:top;margin:0 24px 20px 0}.legend span{margin-right:12px}
.plot{display:inline-block;vertical-align:top;margin:0 16px 16px 0}
"""


def _bar_chart(
    title: str,
    labels: list[str],
    series: list[tuple[str, str, list[float | None]]],
    y_max: float,
    value_text: Callable[[float], str],
    integer_axis: bool = False,
) -> str:
    """An inline SVG bar chart: a group of bars per label, a bar per series labelled with its value (None: ``-``)."""
    width, height, left, bottom, top = 520, 220, 40, 30, 34
    plot_w, plot_h = width - left - 10, height - bottom - top
    group_w = plot_w / max(1, len(labels))
    bar_w = min(48.0, max(3.0, group_w * 0.8 / max(1, len(series))))
    base = height - bottom
    parts = [f'<svg width="{width}" height="{height}" role="img" aria-label="{html.escape(title)}">']
    parts.append(f'<text x="{left}" y="14" font-size="13" font-weight="600">{html.escape(title)}</text>')
    parts.append(f'<line x1="{left}" y1="{base}" x2="{width - 10}" y2="{base}" stroke="#888"/>')
    ticks = sorted({0.0, float(round(y_max / 2)), y_max}) if integer_axis else [0.0, y_max / 2, y_max]
    for tick in ticks:
        y = base - (tick / y_max if y_max > 0 else 0) * plot_h
        parts.append(f'<text x="{left - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{value_text(tick)}</text>')
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - 10}" y2="{y:.1f}" stroke="#eee"/>')
    for i, label in enumerate(labels):
        centre = left + (i + 0.5) * group_w
        x0 = centre - bar_w * len(series) / 2
        for j, (name, colour, values) in enumerate(series):
            value = values[i]
            x = x0 + j * bar_w
            shown = "-" if value is None else value_text(value)
            h = 0.0 if value is None or y_max <= 0 else value / y_max * plot_h
            tip = f"{page_text(name)} step {page_text(label)}: {shown}"
            if h > 0:
                parts.append(
                    f'<rect x="{x:.1f}" y="{base - h:.1f}" width="{bar_w - 2:.1f}" height="{h:.1f}" '
                    f'fill="{colour}"><title>{tip}</title></rect>'
                )
            parts.append(
                f'<text x="{x + (bar_w - 2) / 2:.1f}" y="{base - h - 3:.1f}" font-size="10" '
                f'text-anchor="middle">{shown}</text>'
            )
        parts.append(
            f'<text x="{centre:.1f}" y="{base + 14}" font-size="10" text-anchor="middle">{html.escape(label)}</text>'
        )
    parts.append("</svg>")
    legend = "".join(
        f'<span><svg width="10" height="10"><rect width="10" height="10" fill="{c}"/></svg> {page_text(n)}</span>'
        for n, c, _ in series
    )
    return f'<div class="chart">{"".join(parts)}<div class="legend">{legend}</div></div>'


def _charts(rows: list[Row], quality: str) -> str:
    rate = rate_name(quality)
    out = []
    for role in ROLES:
        role_rows = [r for r in rows if r.role == role]
        if not role_rows:
            continue
        labels = [step_label(r.step) for r in role_rows]
        title = f"{role}: {rate} (valid episodes) per step"
        out.append(
            _bar_chart(title, labels, [(rate, "#2ca02c", [r.pass_rate for r in role_rows])], 1.0, "{:.0%}".format)
        )
        kinds = sorted({k for r in role_rows for k in r.failures})
        series: list[tuple[str, str, list[float | None]]] = [
            (kind, _KIND_COLOURS[i % len(_KIND_COLOURS)], [float(r.failures.get(kind, 0)) for r in role_rows])
            for i, kind in enumerate(kinds)
        ]
        top = max([v for _, _, values in series for v in values if v is not None], default=0.0)
        title = f"{role}: failed episodes by kind per step" + ("" if series else " (none failed)")
        out.append(_bar_chart(title, labels, series, max(1.0, top), "{:g}".format, integer_axis=True))
    return "".join(out)


def _table_html(rows: list[Row], quality: str) -> str:
    per_environment = rows[0].environment is not None if rows else False
    rate = PASS_RATE if per_environment else rate_name(quality)
    headers = ["role", "environment" if per_environment else "step", "episodes", "valid", rate, "failures by kind"]
    headers += ["mean turns", "mean reward" if per_environment else "mean time s"]
    head = "".join(f"<th>{page_text(h)}</th>" for h in headers)
    body = []
    for r in rows:
        role, second, *counts, turns, last, failures = row_cells(r)
        numbers = "".join(f"<td class=num>{n}</td>" for n in counts)  # episodes, valid, rate
        body.append(
            f"<tr><td>{page_text(role)}</td><td>{page_text(second)}</td>{numbers}<td>{page_text(failures)}</td>"
            f"<td class=num>{turns}</td><td class=num>{last}</td></tr>"
        )
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _body_html(parts: list[str | LongText]) -> str:
    """An episode's parts as ``<pre>`` blocks; a long part's start ends its block, the rest follows collapsed."""
    out: list[str] = []
    lines: list[str] = []
    for part in parts:
        if isinstance(part, str):
            lines.append(part)
            continue
        head = cut_head(part.text, INLINE_CHARS)
        rest = part.text[len(head) :]
        lines.append(head)
        if not rest:
            continue
        left_out = max(0, len(part.text) - BLOCK_MAX_CHARS)
        note = f"\n[{left_out:,} more characters are not on this page; the store file has them]" if left_out else ""
        out += [
            f"<pre>{page_text(chr(10).join(lines))}</pre>",
            f"<details class=more><summary>show all ({len(rest):,} more characters)</summary>"
            f"<pre>{page_text(rest[: len(rest) - left_out])}{note}</pre></details>",
        ]
        lines = []
    if lines:
        out.append(f"<pre>{page_text(chr(10).join(lines))}</pre>")
    return "".join(out)


def _episode_html(episode: StoredEpisode) -> str:
    css = "resolved" if episode.passed else "failed" if episode.masked else "unresolved"
    eval_set = episode.entry.get("eval_set")
    limit = _SUMMARY_FIELD_CHARS
    summary = (
        f"{page_text(episode.role)}{'/' + page_text(eval_set, limit) if eval_set else ''} "
        f"{page_text(filed_label(episode), limit)} · "
        f"<b>{page_text(episode.instance_id, limit)}</b> · <span class={css}>{page_text(episode.kind, limit)}</span> · "
        f"reward {page_text(reward_text(episode.entry.get('reward')), limit)} · "
        f"turns {page_text(count_text(episode.record.get('turns')), limit)} · "
        f"<code>{page_text(episode.episode_id[:12])}</code>"
    )
    body = _body_html(episode_parts(episode))
    return f"<details><summary>{summary}</summary><div class=episode>{body}</div></details>"


def render_html(store: Store, title: str) -> str:
    """One self-contained page: per-step table, charts, every episode expandable."""
    rows, quality = summary_rows(store.episodes), quality_label(store.episodes)
    per_environment = ""
    if several_environments(store.episodes):
        by_environment = summary_rows(store.episodes, per_environment=True)
        per_environment = f"<h2>Per environment</h2>{_table_html(by_environment, quality)}"
    problems = "; ".join(map(str, store.problems))
    cut = f"<p class=failed>Unreadable or odd lines or files: {page_text(problems)}</p>" if problems else ""
    episodes = "".join(_episode_html(e) for e in store.episodes)
    swe_only = ""
    if quality != "resolved" and any(e.environment == SWE_ENVIRONMENT for e in store.episodes):
        swe_only = f" The plots' {SWE_RESOLVE_RATE} is over valid SWE-bench episodes alone."
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>{page_text(title)}</title>"
        f"<style>{_CSS}</style></head><body><h1>{page_text(title)}</h1>"
        f"<p>{len(store.episodes)} episodes. The {rate_name(quality)} is over "
        "valid episodes; failed (masked) episodes are counted by kind and are not policy failures."
        f"{swe_only}</p>"
        f"{cut}<h2>Per step</h2>{_table_html(rows, quality)}{per_environment}"
        f"<h2>Over rollout steps</h2>{plots_html(store.episodes)}<h2>Charts</h2>{_charts(rows, quality)}"
        f"<h2>Episodes</h2>{episodes}</body></html>"
    )
