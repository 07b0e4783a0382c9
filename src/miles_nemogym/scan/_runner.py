"""Run a scan: each selected row's episode from ``agent.ScanEpisodes``, run as training runs it."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from rich.console import Console

from miles_nemogym import checks
from miles_nemogym.agent import ScanEpisodes
from miles_nemogym.episode import run as swe_run
from miles_nemogym.episode.record import SWE_ENVIRONMENT, Outcome
from miles_nemogym.errors import MilesNemoGymError, RequestError, SettingsError, counted, redact_url, redact_urls
from miles_nemogym.gym.environments import plan
from miles_nemogym.gym.venv import GymEnvironmentError
from miles_nemogym.scan._config import ScanConfig, scan_settings, usage_problems
from miles_nemogym.scan._inputs import InputError, ScanTask, load_tasks, select
from miles_nemogym.scan._report import ScanProgress, header, render_summary
from miles_nemogym.scan._results import (
    ResultLine,
    ResultsLock,
    ResultsWriter,
    Verdict,
    golden_pair,
    task_digest,
    verdict_of,
)
from miles_nemogym.settings import Settings
from miles_nemogym.smoke import ANSWERED, RecordingPolicy, answers
from miles_nemogym.transport import close_pools, is_loopback

__all__ = ["EXIT_USAGE", "ScanResult", "ScanUsageError", "run_scan"]


Answers = dict[str, tuple[Any, ...]]  # a row's scripted turns by answer: {"gold": turns, "wrong": turns}
CHECK_SESSION = "http://127.0.0.1:9/sessions/check"  # checks a golden row's episode before the policy starts


def gold_answers(tasks: Sequence[ScanTask]) -> dict[str, Answers]:
    """Each row's gold and wrong answer, by task id; ``InputError`` for the first row that has none."""
    names = sorted({task.environment for task in tasks})
    try:
        folders = {environment.name: environment.resources_server for environment in plan(names)}
    except GymEnvironmentError as error:
        raise InputError(
            f"a golden scan of environment rows plays the gold answers of environments nemo-gym ships; {error}; "
            "scan your own environment with --policy-base-url"
        ) from None
    found: dict[str, Answers] = {}
    for task in tasks:
        known = answers(folders[task.environment], task.metadata)  # it reads only the gold fields
        if not known:
            raise InputError(
                f"{task.where}: task {task.instance_id}: no gold answer known for {task.environment}'s rows "
                f"(a golden scan reads the gold of {', '.join(ANSWERED)} rows); scan it with --policy-base-url URL "
                "(a model), or see its rows score with `miles-nemogym smoke --env "
                f"{task.environment}`"
            )
        found[task.instance_id] = known
    return found


def session_base(policy_base_url: str) -> str:
    """An API policy's URL without ``/v1``: environment rows post to ``<base>/v1/chat/completions``, as to a session."""
    if not policy_base_url.endswith("/v1"):
        raise InputError(
            f"--policy-base-url {policy_base_url}: environment rows call <it>/chat/completions as "
            "OpenAI-compatible APIs serve it under /v1; give the URL ending in /v1"
        )
    return policy_base_url.removesuffix("/v1")


async def play_golden(
    task: ScanTask, known: Answers, policy: RecordingPolicy, settings: Settings, episodes: ScanEpisodes
) -> tuple[Outcome, Outcome]:
    """The row's gold, then its wrong answer, each one episode of its own scripted session."""
    played = []
    for turns in known.values():  # gold, then wrong
        episode = episodes.episode(task.metadata, task.environment, policy.session_url(answers=turns), settings)
        outcome = await episode()
        outcome.record.environment = task.environment
        played.append(outcome)
    return played[0], played[1]


EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT


class ScanUsageError(MilesNemoGymError, ValueError):
    """The scan cannot start (exit 2); raised before any episode was sent."""


@dataclass
class ScanResult:
    """The outcome of one scan over the selected instances."""

    config: ScanConfig
    selected: list[ScanTask]
    results: list[ResultLine]  # one per selected instance with a result (earlier runs' too), in input order
    interrupted: bool

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return EXIT_INTERRUPTED
        verdicts = {result.verdict for result in self.results}
        if Verdict.infra in verdicts or len(self.results) < len(self.selected):
            return EXIT_FAILED
        if Verdict.failed in verdicts and not self.config.allow_unresolved:
            return EXIT_FAILED
        return EXIT_OK


@dataclass
class _Prepared:
    settings: Settings
    selected: list[ScanTask]
    pending: list[ScanTask]  # the selected instances without a result yet
    earlier: dict[str, ResultLine]
    digests: dict[str, str]
    lock: ResultsLock | None
    bodies: dict[str, Callable[[], Awaitable[Outcome]]]  # built before the first episode (not golden env rows')
    gold: dict[str, Answers]  # a golden scan of environment rows: each row's gold and wrong
    episodes: ScanEpisodes

    @property
    def environments(self) -> list[str]:
        return sorted({task.environment for task in self.selected} - {SWE_ENVIRONMENT})


def _prepare(config: ScanConfig) -> _Prepared:
    """Everything checked before the first episode; the results file is locked on return."""
    problems = usage_problems(config)
    if problems:
        raise ScanUsageError("; ".join(problems))
    lock = None
    try:
        settings = scan_settings(config)
        tasks = load_tasks(config.input_path, subset=config.subset, split=config.split, golden=config.golden)
        selected = select(tasks, list(config.instance_ids) if config.instance_ids else None, config.limit)
        lock = ResultsLock(config.output_path) if config.output_path else None
        return _prepare_locked(config, settings, tasks, selected, lock)
    except BaseException as error:
        if lock is not None:
            lock.release()
        if isinstance(error, SettingsError | InputError):
            raise ScanUsageError(redact_urls(str(error))) from None  # a settings error quotes the bad URL
        raise


def _foreign_results(config: ScanConfig, earlier: dict[str, ResultLine], digests: dict[str, str]) -> str | None:
    """Why ``earlier`` (the results file) was not written from this scan's input, if it was not."""
    absent = sorted(key for key in earlier if key not in digests)
    changed = sorted(
        key for key, line in earlier.items() if key in digests and line.task_sha256 not in (None, digests[key])
    )
    if not absent and not changed:
        return None
    what = (
        f"{counted(len(absent), 'instance')} that --input {config.input_path} does not hold "
        f"(e.g. {', '.join(absent[:3])})"
        if absent
        else f"{counted(len(changed), 'instance')} whose task rows differ from --input's "
        f"(e.g. {', '.join(changed[:3])})"
    )
    return (
        f"--output {config.output_path} holds results for {what}: it is another input's results file, "
        "and one summary cannot mix them; choose a new --output file (or resume with the input it came from)"
    )


def _prepare_locked(
    config: ScanConfig, settings: Settings, tasks: list[ScanTask], selected: list[ScanTask], lock: ResultsLock | None
) -> _Prepared:
    earlier = lock.read() if lock is not None else {}  # an InputError: _prepare says it
    digests = {task.instance_id: task_digest(task.metadata) for task in tasks}
    if earlier and not config.resume:
        raise ScanUsageError(
            f"--output {config.output_path} already holds {counted(len(earlier), 'result')}; pass --resume to "
            "continue that scan (finished instances are skipped) or choose a new --output file"
        )
    other_modes = sorted({str(line.mode) for line in earlier.values() if line.mode not in (None, config.mode)})
    if other_modes:
        raise ScanUsageError(
            f"--output {config.output_path} holds {', '.join(other_modes)} results and this is a "
            f"{config.mode} scan; one summary cannot mix them: choose a new --output file"
        )
    foreign = _foreign_results(config, earlier, digests)
    if foreign:
        raise ScanUsageError(foreign)
    wanted = {task.instance_id for task in selected}
    earlier = {key: value for key, value in earlier.items() if key in wanted}

    try:
        episodes = ScanEpisodes(config.request_kwargs())
    except RequestError as error:
        raise ScanUsageError(f"the sampling flags cannot be sent: {error}") from None
    pending = [task for task in selected if task.instance_id not in earlier]
    environment_rows = tasks[0].environment != SWE_ENVIRONMENT
    gold: dict[str, Answers] = {}
    base = config.policy_base_url  # an environment row's: the session URL its episode is checked against
    if environment_rows and config.golden:  # an InputError: _prepare says it
        settings = settings.with_overrides(policy_api_key=None)  # the scripted policy needs no key
        gold = gold_answers(pending)
        base = CHECK_SESSION
    elif environment_rows:
        base = session_base(str(config.policy_base_url))
    bodies: dict[str, Callable[[], Awaitable[Outcome]]] = {}
    for task in pending:  # a row that cannot form a body fails now, not as a masked episode later
        try:
            episode = episodes.episode(task.metadata, task.environment, base, settings, send_api_key=base is not None)
        except RequestError as error:
            what = "task" if environment_rows else "instance"
            raise ScanUsageError(f"{task.where}: {what} {task.instance_id}: {error}") from None
        except SettingsError:  # not in NEMO_GYM_ENVS: the gate says so, naming every one missing
            continue
        if not gold:
            bodies[task.instance_id] = episode
    return _Prepared(settings, selected, pending, earlier, digests, lock, bodies, gold, episodes)


def _result_line(
    task: ScanTask, outcome: Outcome, seconds: float, config: ScanConfig, digest: str, wrong: Outcome | None = None
) -> ResultLine:
    """One instance's line; ``wrong``: a golden environment row's wrong answer (``outcome`` its gold)."""
    verdict, kind, reason = verdict_of(outcome) if wrong is None else golden_pair(outcome, wrong)
    environment = None if task.environment == SWE_ENVIRONMENT else task.environment
    return ResultLine(
        task_sha256=digest,
        instance_id=task.instance_id,
        repo=task.repo if environment is None else "?",
        verdict=verdict,
        reward=outcome.reward,
        seconds=round(seconds, 3),
        failure_kind=None if verdict is Verdict.passed else kind,
        reason=reason,
        mode=config.mode,
        nemogym=outcome.record.model_dump(mode="json"),
        eval_report=outcome.eval_report,
        environment=environment,
        wrong_reward=None if wrong is None else wrong.reward,
    )


async def run_scan(
    config: ScanConfig, *, console: Console | None = None, stop: asyncio.Event | None = None
) -> ScanResult:
    """Run and print the scan; ``ScanUsageError`` when it cannot start; ``stop`` cancels in-flight episodes."""
    console, stop = console or Console(), stop or asyncio.Event()
    prepared = _prepare(config)
    try:
        if prepared.pending:
            problem = await asyncio.to_thread(
                server_problem, prepared.settings, config.policy_base_url, config.golden, prepared.environments
            )
            if problem is not None:
                raise ScanUsageError(problem)
        if prepared.gold:
            with RecordingPolicy(look_around_turns=0) as policy:
                return await _run_episodes(config, prepared, console, stop, policy)
        if config.golden and prepared.pending and not prepared.environments:
            settings = prepared.settings
            local = is_loopback(urlsplit(settings.gym_url).hostname or "") and not settings.external_host
            # Each /run names the guard as its policy (on loopback only for a local server): a golden server
            # never calls it, so its first request ends the scan.
            called = asyncio.Event()
            host = "127.0.0.1" if local else "0.0.0.0"
            async with RecordingPolicy(host=host, on_request=lambda _: called.set()) as guard:
                url = swe_run.policy_base_url(f"{guard.url}/golden-check", settings.gym_url, settings.external_host)
                for task in prepared.pending:
                    prepared.bodies[task.instance_id] = prepared.episodes.episode(
                        task.metadata, task.environment, url, settings
                    )
                return await _run_episodes(config, prepared, console, stop, None, (guard, called))
        return await _run_episodes(config, prepared, console, stop, None)
    finally:
        if prepared.lock is not None:
            prepared.lock.release()  # after the last result was written: the results file is complete


def server_problem(
    settings: Settings, policy_base_url: str | None, golden: bool = False, environments: Sequence[str] = ()
) -> str | None:
    """The scan's gate: its first failing check (``environments``: NEMO_GYM_ENVS first), with its fix."""
    missing = [name for name in environments if name not in settings.environments]
    if missing:
        configured = ", ".join(sorted(settings.environments)) or "nothing: it is unset"
        return (
            f"the rows' {'environment' if len(missing) == 1 else 'environments'} {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not in NEMO_GYM_ENVS (it names {configured}); "
            f"start them with `miles-nemogym serve --env {' --env '.join(missing)}` and export the "
            "NEMO_GYM_ENVS it prints"
        )
    target = checks.Target(settings, timeout_s=settings.connect_timeout_s, policy_base_url=policy_base_url)
    if environments:
        policy: list[checks.Wanted] = [] if policy_base_url is None else ["policy answers"]
        results = itertools.chain(checks.run(target, [], environments=environments), checks.run(target, policy))
        failed = next((result for result in results if not result.ok), None)
        return None if failed is None else f"{failed.name}: {failed.detail}; {failed.fix}"
    wanted: list[checks.Wanted] = ["gym answers", "run offered"]
    if policy_base_url is not None:
        wanted += ["policy field", "policy answers"]
    if golden:
        wanted.append("golden server")
    key, failed = next(
        ((key, result) for key, result in zip(wanted, checks.run(target, wanted), strict=True) if not result.ok),
        ("", None),
    )
    if failed is None:
        return None
    hint = ", or scan a golden server with --golden" if key == "policy field" else ""
    return f"{failed.detail}; {failed.fix}{hint}"


async def _run_episodes(
    config: ScanConfig,
    prepared: _Prepared,
    console: Console,
    stop: asyncio.Event,
    policy: RecordingPolicy | None,
    guard: tuple[RecordingPolicy, asyncio.Event] | None = None,
) -> ScanResult:
    finished: dict[str, ResultLine] = dict(prepared.earlier)
    writer = ResultsWriter(prepared.lock) if prepared.lock is not None else None
    semaphore = asyncio.Semaphore(config.concurrency)
    loop = asyncio.get_running_loop()
    progress = ScanProgress(console, len(prepared.selected), prepared.earlier.values())
    where = redact_url(f"{prepared.settings.gym_url}/run")
    if prepared.environments:
        servers = prepared.settings.environments
        where = "NEMO_GYM_ENVS " + ", ".join(
            f"{name} ({redact_url(servers[name].agent or servers[name].url)})" for name in prepared.environments
        )
    console.print(
        header(
            len(prepared.pending),
            len(prepared.selected),
            where,
            f"mode {config.mode}, concurrency {config.concurrency}, "
            f"episode timeout {prepared.settings.run_timeout_s:g}s",
        ),
        highlight=False,
        soft_wrap=not console.is_terminal,
    )
    if prepared.earlier:
        console.print(
            f"resuming: {len(prepared.earlier)} of {counted(len(prepared.selected), 'instance')} already in "
            f"{config.output_path}",
            highlight=False,
        )

    async def one(task: ScanTask) -> None:
        async with semaphore:
            if stop.is_set():
                return
            started = loop.time()
            wrong = None
            if policy is not None:
                outcome, wrong = await play_golden(
                    task, prepared.gold[task.instance_id], policy, prepared.settings, prepared.episodes
                )
            else:
                outcome = await prepared.bodies[task.instance_id]()
                outcome.record.environment = task.environment
            seconds = loop.time() - started
        result = _result_line(task, outcome, seconds, config, prepared.digests[task.instance_id], wrong)
        if writer is not None:
            writer.write(result)  # before it is reported: what was shown is on disk
        finished[task.instance_id] = result
        progress.finished(result)

    episodes = [asyncio.ensure_future(one(task)) for task in prepared.pending]
    everything = asyncio.gather(*episodes)
    waiters: set[asyncio.Future[Any]] = {everything, asyncio.ensure_future(stop.wait())}
    if guard is not None:
        waiters.add(asyncio.ensure_future(guard[1].wait()))
    interrupted = False
    try:
        with progress:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            if everything.done():
                everything.result()  # a failure to write the results file ends the scan
            else:
                interrupted = True  # by ``stop``, or by the guard
    finally:
        for future in [*episodes, *waiters - {everything}]:
            future.cancel()
        if episodes:
            # Cancelled episodes close their connections; none of them writes a line.
            await asyncio.wait(episodes)
        if everything.done() and not everything.cancelled():
            everything.exception()  # retrieved: reported above or superseded by the cancellation
        await close_pools()

    called = guard[0].requests() if interrupted and guard is not None else []
    if called:
        raise ScanUsageError(
            f"{where} is not a golden server: its /run called a model ({called[0].method} {called[0].path} on the "
            "check endpoint a golden scan sends as policy_base_url), so it plays the task with a model instead of "
            "applying the gold patch; restart it with `miles-nemogym serve --golden` (or scan a policy with "
            "--policy-base-url)"
        )
    results = [finished[task.instance_id] for task in prepared.selected if task.instance_id in finished]
    render_summary(
        console,
        results,
        selected=len(prepared.selected),
        earlier=len(prepared.earlier),
        golden=config.golden,
        interrupted=interrupted,
    )
    return ScanResult(config, prepared.selected, results, interrupted)
