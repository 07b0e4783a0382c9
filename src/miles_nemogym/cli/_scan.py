"""``miles-nemogym scan``: golden and API-policy scans of a NeMo-Gym server, or of environment rows."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from miles_nemogym.cli._console import fail
from miles_nemogym.cli._options import GymUrl, InstanceIds, subset_option

__all__ = ["register"]

_EPILOG = (
    "Exit codes: 0 every instance passed (reward 1.0) with no infrastructure failure; "
    "1 some instance failed or hit an infrastructure failure; 2 the scan could not start "
    "(bad flags, settings or input file, unreachable server) and sent nothing; "
    "130 stopped by Ctrl-C (finished results kept, summary printed)."
)


def _scan(
    input_path: Annotated[
        Path,
        typer.Option(
            "--input",
            "-i",
            help="Task rows: converter output ({prompt, metadata}) or raw SWE-bench / NeMo-Gym rows, "
            "as JSON Lines or .parquet; or environment rows as `convert --env` writes them (run on "
            "NEMO_GYM_ENVS). One kind per file.",
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Results JSONL, one line appended (and flushed) per finished instance."),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Skip the instances already in --output and finish the rest.")
    ] = False,
    golden: Annotated[
        bool,
        typer.Option(
            "--golden",
            help="The server runs with run_golden: true; every reward must be 1.0, each other one is "
            "reported with its reason. Environment rows: each row's gold answer must pass and a wrong "
            "one must not (a row without a known gold answer is refused, naming the environments that have one).",
        ),
    ] = False,
    policy_base_url: Annotated[
        str | None,
        typer.Option(
            "--policy-base-url",
            help="API-policy mode: the OpenAI-compatible endpoint (ending in /v1) that drives each "
            "episode, sent as the /run body's policy_base_url. Its key comes only from the environment "
            "variable NEMO_GYM_POLICY_API_KEY. It must answer before the first episode; a scan needs "
            "this or --golden.",
        ),
    ] = None,
    gym_url: GymUrl = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Scan at most this many instances (after --instance-ids).")
    ] = None,
    instance_ids: InstanceIds = None,
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", min=1, help="Episodes in flight at once.")] = 4,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            min=0.001,
            help="Each episode's deadline in seconds, queueing on the server included (default: "
            "NEMO_GYM_RUN_TIMEOUT, 3600).",
        ),
    ] = None,
    temperature: Annotated[
        float | None, typer.Option("--temperature", help="Sampling temperature sent to the policy.")
    ] = None,
    top_p: Annotated[
        float | None, typer.Option("--top-p", min=0.0, max=1.0, help="Nucleus sampling top_p sent to the policy.")
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", min=1, help="Most tokens per model call (max_output_tokens).")
    ] = None,
    subset: Annotated[
        str | None, subset_option("For raw rows without one: verified (SWE-bench images) or gym (SWE-Gym images).")
    ] = None,
    split: Annotated[
        str | None, typer.Option("--split", help="For raw rows without one (recorded only; default test).")
    ] = None,
    allow_unresolved: Annotated[
        bool,
        typer.Option(
            "--allow-unresolved",
            help="API-policy scans: exit 0 when every episode was graded, whatever its reward "
            "(infrastructure failures still exit 1).",
        ),
    ] = False,
) -> None:
    """Run SWE-bench instances, or environment rows, through NeMo-Gym exactly as training will, and report."""
    from miles_nemogym.cli._console import console
    from miles_nemogym.data import parse_instance_ids
    from miles_nemogym.scan import execute

    err = console(stderr=True)
    try:
        ids = tuple(parse_instance_ids(instance_ids)) if instance_ids is not None else None
    except ValueError as error:  # --instance-ids that cannot be read or holds no id
        fail(err, f"scan cannot start: {error}", markup=False, highlight=False)
    code = execute(
        console=console(),
        err=err,
        input_path=input_path,
        output_path=output,
        resume=resume,
        golden=golden,
        limit=limit,
        instance_ids=ids,
        concurrency=concurrency,
        timeout_s=timeout,
        gym_url=gym_url,
        policy_base_url=policy_base_url,
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        subset=subset,
        split=split,
        allow_unresolved=allow_unresolved,
    )
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("scan", epilog=_EPILOG)(_scan)
