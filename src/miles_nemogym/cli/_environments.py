"""``miles-nemogym environments``: NeMo-Gym's catalog as ``gym list environments`` names it, and
what this package does with each entry."""

from __future__ import annotations

import json
import textwrap
from typing import TYPE_CHECKING, Annotated, Literal

import typer

if TYPE_CHECKING:
    from miles_nemogym.gym.catalog import Listed

__all__ = ["register"]

_HELP = """List NeMo-Gym's catalog, the names `gym list environments` prints (environments and
benchmarks), with what this package does with each: runs it in-process, routes it to its agent,
needs something (a judge), refuses it (and why), or does not serve it yet.
NAME shows one entry: its agent, resources servers, datasets, prompt config, repeats, reward
range and the commands to try it. Reads the catalog once per NeMo-Gym server environment
(built on first use, minutes), then answers from the cache.
"""


def _environments(
    name: Annotated[str | None, typer.Argument(help="One catalog name (or a resources server's short name).")] = None,
    kind: Annotated[Literal["environment", "benchmark"] | None, typer.Option(help="Only this kind of entry.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON for scripts, one object per entry.")] = False,
) -> None:
    from miles_nemogym.fit import terminal_width
    from miles_nemogym.gym.catalog import UnknownCatalogNameError, listing
    from miles_nemogym.gym.venv import GymEnvironmentError

    try:
        chosen = listing(name, kind, progress=lambda line: typer.echo(line, err=True))
    except (UnknownCatalogNameError, GymEnvironmentError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2 if isinstance(error, UnknownCatalogNameError) else 1) from None
    if as_json:
        out = [{**e.entry.model_dump(mode="json"), "here": e.here.model_dump()} for e in chosen]
        typer.echo(json.dumps(out[0] if name else out, indent=None if not name else 2))
        return
    width = terminal_width()  # at least fit.MIN_WIDTH
    if name:
        typer.echo(_detail(chosen[0], width))
        return
    column = min(max(len(e.entry.name) for e in chosen), width - 4 - chosen[0].widest)
    for group in ("environment", "benchmark"):
        members = [e for e in chosen if e.entry.kind == group]
        if not members:
            continue
        typer.echo(f"{group}s ({len(members)})")
        for listed in members:
            entry, here = listed.entry, listed.short
            if len(entry.name) > column:
                typer.echo(f"  {entry.name}\n  {'':{column}}  {here}")
            else:
                typer.echo(f"  {entry.name:{column}}  {here}")
    typer.echo("`miles-nemogym environments NAME` shows one entry and the commands to try it.")


def _detail(listed: Listed, width: int) -> str:
    entry, found = listed.entry, listed.here
    lines = [f"{entry.name} ({entry.kind})"]
    if entry.description:
        lines += textwrap.wrap(entry.description, width - 2, initial_indent="  ", subsequent_indent="  ")
    facts = [
        ("agent", entry.agent_server or entry.agent),
        ("resources servers", ", ".join(entry.resources_servers) or entry.resources_server),
        ("config", entry.config),
        ("prompt config", entry.prompt_config),
        ("repeats", str(entry.num_repeats) if entry.num_repeats else None),
        ("reward range", "[{}, {}]".format(*entry.reward_range) if entry.reward_range else None),
        ("sandbox", entry.sandbox),
    ]
    lines += [f"  {label}: {value}" for label, value in facts if value]
    for dataset in entry.datasets:
        extra = ", ".join(f"{k} {v}" for k, v in (("type", dataset.type), ("repeats", dataset.num_repeats)) if v)
        lines.append(f"  dataset: {dataset.name}" + (f" ({extra})" if extra else ""))
    lines.append(f"here: {found.status}")
    if found.needs:
        label = "why" if listed.refused else "needs"
        lines += textwrap.wrap(found.needs, width - 2, initial_indent=f"  {label}: ", subsequent_indent="    ")
    grader = listed.grader
    if listed.rows and grader:
        rows = entry.name if listed.rows == "shipped" else f"{entry.name}=PREPARED.jsonl"
        out = entry.name.replace("/", ".")
        lines += ["try it:"]
        if listed.rows == "prepared":
            lines.append(f"  gym eval prepare --benchmark {entry.name}")
        judge = " --judge-url URL --judge-model NAME" if "judge (`--judge-url`)" in found.needs else ""
        lines += [
            *_command(f"miles-nemogym serve --env {grader}{judge}{_trainer(grader)}", width),
            *_command(f"miles-nemogym convert --env {rows} --output {out}.jsonl", width),
            "  python examples/swebench_grpo/run.py ... \\",
            f"    --eval-data {out}={out}.jsonl",
        ]
        if entry.num_repeats:
            n = entry.num_repeats
            lines.append(f"  ({n} sample{'s' * (n > 1)} per prompt: nemogym-eval/{out}/pass@k, reward_mean)")
    short = listed.served
    if short:
        judge = " --judge-url URL --judge-model NAME" if listed.judged else ""
        lines += [
            "try it:",
            *_command(f"miles-nemogym serve --env {short}{judge}{_trainer(short)}", width),
            *_command(f"miles-nemogym smoke --env {short}{judge}", width),
            *_command(f"miles-nemogym examples --env {short} --output {short}.jsonl", width),
            *_command(f"miles-nemogym convert --env {short}={short}.jsonl --output prompts.jsonl", width),
        ]
    return "\n".join(lines)


def _trainer(name: str) -> str:
    """``--session-server`` when ``serve`` plays ``name`` through its agent's ``/run`` (judged or not), else nothing."""
    from miles_nemogym.gym.environments import plan

    [played] = plan([name])
    return " --session-server HOST:PORT" if played.agent else ""


def _command(command: str, width: int) -> list[str]:
    """``command`` indented, split between words with ``\\`` where it would pass ``width``."""
    words = command.split()
    lines, line = [], " "
    for index, word in enumerate(words):
        room = width - (0 if index == len(words) - 1 else 2)  # the " \\" a line that goes on ends with
        if len(line) + 1 + len(word) > room and line.strip():
            lines.append(f"{line} \\")
            line = "   "
        line += f" {word}"
    return [*lines, line]


def register(app: typer.Typer) -> None:
    app.command("environments", help=_HELP)(_environments)
