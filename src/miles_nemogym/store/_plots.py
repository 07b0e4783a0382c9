"""Curves over rollout steps from an episode store's heads alone: ``plots`` is the data (pure),
``svg`` draws one plot as a self-contained SVG (no scripts, no links), every label escaped."""

from __future__ import annotations

import html
import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from miles_nemogym.episode.record import SWE_ENVIRONMENT, finite, pass_at_k, percentile
from miles_nemogym.store import ROLES
from miles_nemogym.store._browser import SWE_RESOLVE_RATE, mean, printable, quality_label, rate_name
from miles_nemogym.store._reader import StoredEpisode

__all__ = ["plots", "svg"]

TRAIN, EVAL = ROLES


@dataclass(frozen=True)
class Series:
    """One curve: a value per step of its plot; None where the step has nothing to measure."""

    name: str
    values: tuple[float | None, ...]


@dataclass(frozen=True)
class Plot:
    """One chart (``name``.svg): y axis ``unit`` ``rate`` (0–100 %), ``reward`` or ``s``; x: rollout steps."""

    name: str
    title: str
    unit: str
    steps: tuple[int, ...]
    series: tuple[Series, ...]


def _valid(members: list[StoredEpisode]) -> list[StoredEpisode]:
    return [e for e in members if not e.masked]


def _by_step(episodes: list[StoredEpisode]) -> dict[int, list[StoredEpisode]]:
    """Episodes per rollout step, steps in order (pending episodes have none: left out)."""
    groups: dict[int, list[StoredEpisode]] = defaultdict(list)
    for episode in episodes:
        if episode.step is not None:
            groups[episode.step].append(episode)
    return dict(sorted(groups.items()))


def _resolve_rate(members: list[StoredEpisode]) -> float | None:
    """Over valid SWE episodes (another environment's are neither); a resolve is ``passed``, the tables' rule."""
    valid = [e for e in _valid(members) if e.environment == SWE_ENVIRONMENT]
    return sum(1 for e in valid if e.passed) / len(valid) if valid else None


def _reward_mean(members: list[StoredEpisode]) -> float | None:
    return mean(finite(e.entry.get("reward")) for e in _valid(members))


def _train_plots(steps: dict[int, list[StoredEpisode]], rate: str) -> list[Plot]:
    """Train's plots; ``rate`` names the resolve rate (``SWE_RESOLVE_RATE`` when it covers part of the store)."""
    order = tuple(steps)
    groups = list(steps.values())
    environments = sorted({e.environment for m in groups for e in m})
    series = [Series("reward mean", tuple(_reward_mean(m) for m in groups))]
    if SWE_ENVIRONMENT in environments:
        series.append(Series(rate, tuple(_resolve_rate(m) for m in groups)))
    title = f"train: {' and '.join(s.name for s in series)} (valid episodes)"
    quality = Plot("train-reward-resolve-rate", title, "reward", order, tuple(series))
    means = [
        Series(env, tuple(_reward_mean([e for e in m if e.environment == env]) for m in groups)) for env in environments
    ]
    title = "train: reward mean per environment (valid episodes)"
    per_environment = Plot("train-reward-per-environment", title, "reward", order, tuple(means))
    kinds = [Counter(e.kind for e in m if e.masked) for m in groups]
    names = sorted({kind for counts in kinds for kind in counts})
    rates = [Series("all kinds", tuple(sum(c.values()) / len(m) for c, m in zip(kinds, groups, strict=True)))]
    rates += [Series(k, tuple(c[k] / len(m) for c, m in zip(kinds, groups, strict=True))) for k in names]
    title = "train: failure rate (set-aside episodes) by kind" + ("" if names else " (none failed)")
    failures = Plot("train-failure-rate", title, "rate", order, tuple(rates))
    # As nemogym/episode_time_*: episodes that were sent (attempts), valid or not.
    times = [[t for e in m if e.record.get("attempts") and (t := finite(e.record.get("elapsed_s"))) is not None]
             for m in groups]  # fmt: skip
    percentiles = [Series(label, tuple(percentile(t, q) if t else None for t in times))
                   for label, q in (("p50", 50), ("p95", 95), ("max", 100))]  # fmt: skip
    time = Plot("train-episode-time", "train: episode time percentiles", "s", order, tuple(percentiles))
    return [quality, *([per_environment] if len(environments) > 1 else []), failures, time]


def _pass(members: list[StoredEpisode]) -> tuple[int, float | None, float | None]:
    """(k: most episodes of one instance, pass@1, pass@k over instances with k valid ones) of a step."""
    k = max(Counter(e.instance_id for e in members).values())
    passed: dict[str, list[bool]] = defaultdict(list)
    for episode in _valid(members):
        passed[episode.instance_id].append(episode.passed)
    at_1 = mean([sum(v) / len(v) for v in passed.values()])
    at_k = mean([pass_at_k(len(v), sum(v), k) for v in passed.values() if len(v) >= k])
    return k, at_1, at_k


def _eval_plot(eval_set: str, steps: dict[int, list[StoredEpisode]], name: str) -> Plot:
    found = [_pass(members) for members in steps.values()]
    ks = {k for k, _, _ in found}
    series = [Series("pass@1", tuple(at_1 for _, at_1, _ in found))]
    if ks != {1}:
        per_step = ", ".join(str(k) for k, _, _ in found)
        label = f"pass@{ks.pop()}" if len(ks) == 1 else f"pass@k (k per step: {per_step})"
        series.append(Series(label, tuple(at_k for _, _, at_k in found)))
    title = f"eval {eval_set}: {' and '.join(s.name for s in series)}"
    environments = sorted({e.environment for m in steps.values() for e in m})
    if len(environments) > 1:  # each environment's pass@1 (its own instances), beside the set's
        title += " (and pass@1 per environment)"
        for env in environments:
            values = [_pass(here)[1] if (here := [e for e in m if e.environment == env]) else None
                      for m in steps.values()]  # fmt: skip
            series.append(Series(f"pass@1 {env}", tuple(values)))
    return Plot(name, title, "rate", tuple(steps), tuple(series))


def _file_name(text: str, taken: set[str]) -> str:
    """A file name from store text: letters, digits, ``_.-`` only, not hidden, not taken."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:60].lstrip(".") or "_"
    name, n = stem, 1
    while name in taken:
        n += 1
        name = f"{stem}-{n}"
    taken.add(name)
    return name


def plots(episodes: list[StoredEpisode]) -> list[Plot]:
    """Train's plots (three, four with several environments), then one per eval set; none unsealed."""
    out: list[Plot] = []
    train = _by_step([e for e in episodes if e.role == TRAIN])
    if train:
        # The same quantity as the tables' rate only when every episode is SWE-bench's.
        quality = quality_label(episodes)
        out += _train_plots(train, rate_name(quality) if quality == "resolved" else SWE_RESOLVE_RATE)
    sets: dict[str, list[StoredEpisode]] = defaultdict(list)
    for episode in episodes:
        if episode.role == EVAL:
            sets[str(episode.entry.get("eval_set") or "")].append(episode)
    taken = {p.name for p in out}
    for eval_set, members in sorted(sets.items()):
        steps = _by_step(members)
        if steps:
            out.append(_eval_plot(eval_set or "(no set name)", steps, _file_name(f"eval-{eval_set}-pass-at-k", taken)))
    return out


_COLOURS = ("#1f77b4", "#2ca02c", "#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")
_NOT_XML = re.compile("[\ud800-\udfff\ufffe\uffff]")
_WIDTH, _HEIGHT, _LEFT, _RIGHT, _TOP, _BOTTOM = 560, 270, 56, 16, 40, 44
_PAD = 24  # between the y axis (the right end) and the first (last) step
_LABELLED_STEPS = 12  # up to this many steps every point is labelled with its value; past it, the last one


def page_text(value: object, limit: int | None = None) -> str:
    """Store text as page (HTML, SVG) text: printable, valid XML characters, at most ``limit``, escaped."""
    text = _NOT_XML.sub("\ufffd", printable(str(value)))
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return html.escape(text)


def _nice(top: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten at or above ``top`` (> 0); ``top`` near a float's limit."""
    power = 10.0 ** math.floor(math.log10(top))
    nice = (m * power for m in (1, 2, 2.5, 5, 10) if m * power >= top * (1 - 1e-9))
    return next((value for value in nice if math.isfinite(value)), top)


def _y_range(plot: Plot) -> tuple[float, float]:
    values = [v for s in plot.series for v in s.values if v is not None]
    if plot.unit == "rate":
        return 0.0, 1.0
    low = min([0.0, *values])
    high = max([1.0 if plot.unit == "reward" else 0.0, *values])
    if high <= low:
        high = low + 1.0
    return (-_nice(-low) if low < 0 else 0.0), _nice(high) if high > 0 else 0.0


def _value_text(unit: str) -> Callable[[float], str]:
    if unit == "rate":
        return lambda v: f"{v:.0%}" if v in (0.0, 1.0) or abs(v * 100 - round(v * 100)) < 1e-9 else f"{v:.1%}"
    if unit == "s":
        return lambda v: f"{v:.0f} s" if abs(v) >= 10 or v == 0 else f"{v:.1f} s"
    return lambda v: f"{v:.2f}".rstrip("0").rstrip(".") if v != int(v) else f"{v:.0f}"


_LINE = 11  # height of a value label's line: labels of one step this far apart never overlap


def _label_y(point_y: float, n: int, taken: list[float]) -> float:
    """Where series ``n``'s value label goes for a point at ``point_y``: above it (or below, clear of the
    title), alternating heights, a line on while it would overlap a label ``taken`` at the same step."""
    above = point_y - 7 - _LINE * (n % 2)
    step = -_LINE if above > _TOP - 6 else _LINE
    label_y = above if above > _TOP - 6 else point_y + 14 + _LINE * (n % 2)  # not into the title
    while any(abs(label_y - other) < _LINE for other in taken):
        label_y += step
        if label_y <= _TOP - 6:  # no room left above: go below the point instead
            step, label_y = _LINE, point_y + 14
    return label_y


def svg(plot: Plot, *, standalone: bool = True) -> str:
    """``plot`` as SVG (its namespace only ``standalone``): a line per series broken where a step has no
    value, points with tooltips and values (``_LABELLED_STEPS``), a legend with each latest value."""
    fmt = _value_text(plot.unit)
    low, high = _y_range(plot)
    plot_w, plot_h = _WIDTH - _LEFT - _RIGHT, _HEIGHT - _TOP - _BOTTOM
    first, last = plot.steps[0], plot.steps[-1]

    def x(step: int) -> float:
        inner = plot_w - 2 * _PAD
        return _LEFT + _PAD + (inner / 2 if last == first else (step - first) / (last - first) * inner)

    def y(value: float) -> float:
        return _TOP + plot_h - (value / 2 - low / 2) / (high / 2 - low / 2) * plot_h  # halves: no overflow

    legend_h = 16 * len(plot.series)
    title = page_text(plot.title).replace("\n", " ")
    namespace = ' xmlns="http://www.w3.org/2000/svg"' if standalone else ""
    out = [
        f'<svg{namespace} width="{_WIDTH}" height="{_HEIGHT + legend_h}" '
        f'viewBox="0 0 {_WIDTH} {_HEIGHT + legend_h}" role="img" aria-label="{title}" '
        'font-family="system-ui,sans-serif">',
        f"<title>{title}</title>",
        '<rect width="100%" height="100%" fill="#fff"/>',
        f'<text x="{_LEFT}" y="18" font-size="13" font-weight="600">{title}</text>',
    ]
    for i in range(5):  # y grid and ticks
        tick = low * ((4 - i) / 4) + high * (i / 4)  # never past a float's range, as (high - low) can be
        out.append(f'<line x1="{_LEFT}" y1="{y(tick):.1f}" x2="{_LEFT + plot_w}" y2="{y(tick):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{_LEFT - 5}" y="{y(tick) + 4:.1f}" font-size="10" text-anchor="end">{fmt(tick)}</text>')
    base = _TOP + plot_h
    out.append(f'<line x1="{_LEFT}" y1="{base}" x2="{_LEFT + plot_w}" y2="{base}" stroke="#888"/>')
    out.append(f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{base}" stroke="#888"/>')
    every = len(plot.steps) <= _LABELLED_STEPS  # then every step is a tick, past it about 8 and the last
    for step in plot.steps if every else sorted({*plot.steps[:: math.ceil(len(plot.steps) / 8)], plot.steps[-1]}):
        out.append(f'<line x1="{x(step):.1f}" y1="{base}" x2="{x(step):.1f}" y2="{base + 4}" stroke="#888"/>')
        out.append(f'<text x="{x(step):.1f}" y="{base + 15}" font-size="10" text-anchor="middle">{step}</text>')
    out.append(
        f'<text x="{_LEFT + plot_w / 2:.1f}" y="{base + 34}" font-size="11" text-anchor="middle">rollout step</text>'
    )
    y_label = {"rate": "rate (%)", "s": "seconds", "reward": "value"}[plot.unit]
    out.append(
        f'<text transform="translate(13 {_TOP + plot_h / 2:.1f}) rotate(-90)" font-size="11" '
        f'text-anchor="middle">{y_label}</text>'
    )
    radius = 3 if len(plot.steps) <= 60 else 1.5
    labels: list[str] = []  # drawn last, haloed, so no line crosses a value
    placed: dict[int, list[tuple[str, float]]] = defaultdict(list)  # per step: (text, y) of its labels
    empty = {s for i, s in enumerate(plot.steps) if all(series.values[i] is None for series in plot.series)}
    for step in sorted(empty):  # a step with nothing to measure: a grey band, not a point at 0
        out.append(
            f'<rect x="{x(step) - 9:.1f}" y="{_TOP}" width="18" height="{plot_h}" fill="#f0f0f0">'
            f"<title>step {step}: no valid episodes</title></rect>"
            f'<text transform="translate({x(step) + 3:.1f} {base - 6}) rotate(-90)" font-size="10" fill="#888">'
            "no valid episodes</text>"
        )
    for n, series in enumerate(plot.series):
        colour = _COLOURS[n % len(_COLOURS)]
        name = page_text(series.name).replace("\n", " ")
        dash = ' stroke-dasharray="6 3"' if n % 2 else ""  # a series under another still shows
        runs: list[list[tuple[float, float]]] = [[]]
        for step, value in zip(plot.steps, series.values, strict=True):
            if value is None:
                runs.append([])
                if step in empty:
                    continue
                gap = f"{name} step {step}: nothing to measure"
                out.append(
                    f'<text x="{x(step):.1f}" y="{base - 4}" font-size="10" fill="{colour}" '
                    f'text-anchor="middle">–<title>{gap}</title></text>'
                )
                continue
            runs[-1].append((x(step), y(value)))
        for run in runs:
            if len(run) > 1:
                points = " ".join(f"{px:.1f},{py:.1f}" for px, py in run)
                out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        shown = [(s, v) for s, v in zip(plot.steps, series.values, strict=True) if v is not None]
        for i, (step, value) in enumerate(shown):
            out.append(
                f'<circle cx="{x(step):.1f}" cy="{y(value):.1f}" r="{radius}" fill="{colour}">'
                f"<title>{name} step {step}: {fmt(value)}</title></circle>"
            )
            text = fmt(value)
            if (every or i == len(shown) - 1) and all(t != text for t, _ in placed[step]):  # a value once a step
                label_y = _label_y(y(value), n, [at for _, at in placed[step]])
                placed[step].append((text, label_y))
                labels.append(
                    f'<text x="{x(step):.1f}" y="{label_y:.1f}" font-size="10" fill="{colour}" '
                    f'text-anchor="middle" stroke="#fff" stroke-width="3" paint-order="stroke">{text}</text>'
                )
        latest = f"latest {fmt(shown[-1][1])} (step {shown[-1][0]})" if shown else "no valid episodes"
        legend_y = _HEIGHT + 16 * n + 4
        out.append(f'<rect x="{_LEFT}" y="{legend_y - 9}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{_LEFT + 16}" y="{legend_y}" font-size="11">{name}: {latest}</text>')
    out += labels
    out.append("</svg>")
    return "".join(out)


def plots_html(episodes: list[StoredEpisode]) -> str:
    """The plots for the HTML page, each inline, or a line saying there are none."""
    drawn = plots(episodes)
    if not drawn:
        return "<p>No rollout step sealed yet: nothing to plot over steps.</p>"
    return "".join(f'<div class="plot">{svg(p, standalone=False)}</div>' for p in drawn)
