"""``miles-nemogym episodes`` on crafted store content: every view shows what it can, escapes
or strips what could act on the reader (HTML, terminal control sequences), never raises,
and ``--html`` never writes where it should not."""

from __future__ import annotations

import html
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miles_nemogym.cli.main import app
from miles_nemogym.episode.run import classify_http
from miles_nemogym.store import EpisodeStore
from tests.support.hostile_store import entry, run_answer, write_step

SCRIPT = "<script>document.title='ran'</script><img src=x onerror=alert(1)>"


def invoke(*args: str | Path) -> Any:
    return CliRunner().invoke(app, ["episodes", *map(str, args)])


def no_traceback(result: Any) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output


# ----------------------------------------------------------------------------- the page


def test_page_escapes_every_store_value(tmp_path: Path) -> None:
    answer = run_answer(
        [
            {"type": "message", "content": [{"type": "output_text", "text": SCRIPT}]},
            {"type": "function_call", "arguments": {"command": SCRIPT}},
            {"type": "function_call_output", "output": SCRIPT},
        ],
        patch=SCRIPT,
        report={"resolved": SCRIPT, "tests_status": {"FAIL_TO_PASS": {"failure": [SCRIPT]}}},
        instance=SCRIPT,
    )
    crafted = entry(
        SCRIPT,
        answer,
        instance_id=SCRIPT,
        eval_set=SCRIPT,
        session_id=SCRIPT,
        reward=SCRIPT,
        record={"turns": SCRIPT, "instance_id": SCRIPT, "elapsed_s": SCRIPT},
    )
    masked = entry(
        "m",
        None,
        reward=SCRIPT,
        record={"mask_sample": True, "failure_kind": SCRIPT, "failure_reason": SCRIPT, "tool_calls": SCRIPT},
    )
    write_step(tmp_path / "ep", "train", 1, [crafted, masked])
    write_step(tmp_path / "ep", "eval", 1, [{**crafted, "episode_id": "e"}])
    page = tmp_path / "page.html"
    result = invoke(tmp_path / "ep", "--html", page)
    assert result.exit_code == 0, result.output
    text = page.read_text()
    assert "<script" not in text and "<img" not in text
    assert text.count(" · reward - · ") == 3  # a reward that is no number: store.views.reward_text, never its markup
    assert text.count(SCRIPT.replace("<", "&lt;").replace(">", "&gt;").replace("'", "&#x27;")) >= 20


def test_page_collapses_a_long_patch_and_output(tmp_path: Path) -> None:
    from miles_nemogym.store._page import BLOCK_MAX_CHARS, INLINE_CHARS

    patch = "".join(f"+line {i} of a huge patch\n" for i in range(200_000))  # 5.3 MB
    output = "x" * 50_000
    answer = run_answer(
        [{"type": "function_call", "arguments": "{}"}, {"type": "function_call_output", "output": output}], patch=patch
    )
    write_step(tmp_path / "ep", "train", 1, [entry("big", answer)])
    page = tmp_path / "page.html"
    assert invoke(tmp_path / "ep", "--html", page).exit_code == 0
    text = page.read_text()
    assert len(patch) > 5_000_000 and len(text) < 2 * BLOCK_MAX_CHARS + 20_000
    shown, more = re.search(r"--- patch\n(.*?)</pre><details class=more><summary>(.*?)</summary>", text, re.S).groups()
    assert patch.startswith(shown) and len(shown) <= INLINE_CHARS and shown.endswith("\n")  # cut at a line end
    assert more == f"show all ({len(patch) - len(shown):,} more characters)"
    assert f"[{len(patch) - BLOCK_MAX_CHARS:,} more characters are not on this page" in text
    # The output: its start at once, the rest (all of it, under the cap) behind "show all".
    rest = len(output) - INLINE_CHARS
    assert f"show all ({rest:,} more characters)</summary><pre>{'x' * rest}</pre>" in text


# ----------------------------------------------------------------------------- --show


CONTROLS = (
    "\x1b]52;c;cm0gLXJmIH4K\x07"  # OSC 52: write the clipboard
    "\x1b]0;owned title\x1b\\"  # OSC 0: set the window title (ST-terminated)
    "\x1b[2J\x1b[H\x1b[31m"  # CSI: clear the screen, cursor home, red
    "\x1bc"  # RIS: full reset
    "\x9b2J\x9d2;c1 title\x9c"  # the same as 8-bit C1 controls
    "\x1bP1$rdcs\x1b\\"  # DCS string
    "\x07\x08\x0e\x7f\r"  # BEL, backspace, shift-out, DEL, carriage return
)


def test_show_strips_terminal_control_sequences(tmp_path: Path) -> None:
    text = f"before{CONTROLS}after"
    answer = run_answer(
        [
            {"type": "message", "content": [{"text": text}]},
            {"type": "function_call", "arguments": {"command": text}},
            {"type": "function_call_output", "output": "line 1\r\nline 2\tcolumn\n" + text},
        ],
        patch=text,
        report={"resolved": text, "tests_status": {"FAIL_TO_PASS": {"failure": [text]}}},
    )
    write_step(
        tmp_path / "ep",
        "train",
        1,
        [
            entry(
                f"id{CONTROLS}",
                answer,
                instance_id=text,
                reward=text,
                record={"failure_kind": text, "failure_reason": text, "mask_sample": True},
            )
        ],
    )
    for args in (("--show", "id"), ("--step", "1"), ()):
        result = invoke(tmp_path / "ep", *args)
        assert result.exit_code == 0, result.output
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", result.output), repr(result.output)
        for leftover in ("52;c", "cm0g", "owned", "2J", "31m", "c1 title", "$rdcs"):
            assert leftover not in result.output
    shown = invoke(tmp_path / "ep", "--show", "id").output
    assert shown.count("beforeafter") >= 8 and "line 1\nline 2\tcolumn\n" in shown


def test_the_episode_list_strips_control_sequences_from_a_count(tmp_path: Path) -> None:
    """A count of the wrong type (a string, short enough that its column is kept) is shown as
    text in the list: cleaned like the rest."""
    write_step(tmp_path / "ep", "train", 1, [entry("a", record={"turns": "\x1b]0;owned\x07\x1b[2J7"})])
    result = invoke(tmp_path / "ep", "--step", "1")
    assert result.exit_code == 0, result.output
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", result.output), repr(result.output)
    assert "owned" not in result.output and "2J" not in result.output


# ----------------------------------------------------------------------------- odd content


ODD_ITEMS: list[Any] = [
    {"type": "message", "content": 5},
    {"type": "message", "content": "plain string content"},
    {"type": "message", "content": [1, None, "a bare string part", {"text": 7}, {"type": "output_text", "text": "ok"}]},
    {"type": "reasoning", "summary": {"text": "a summary that is not a list"}},
    {"type": "function_call", "arguments": 7},
    {"type": "function_call", "arguments": {"command": ["ls", "-la"]}},
    {"type": "function_call", "arguments": "not json {"},
    {"type": "function_call_output", "output": [{"type": "input_text", "text": "listed"}]},
    {"type": "function_call_output", "output": {"weird": True}},
    "a string where an item should be",
    42,
    None,
]


def test_odd_trajectory_items_are_shown_as_best_can_be(tmp_path: Path) -> None:
    odd = run_answer(
        ODD_ITEMS, report={"resolved": True, "tests_status": {"FAIL_TO_PASS": "x", "PASS_TO_PASS": {"failure": 3}}}
    )
    odd["response"]["output"] = ODD_ITEMS
    write_step(
        tmp_path / "ep",
        "train",
        1,
        [
            entry("odd", odd),
            entry("odd-output", {"response": {"output": {"not": "a list"}}, "metadata": "not a dict"}),
            entry("odd-answer", [1, 2, 3]),
            entry("fine", run_answer([{"type": "message", "content": [{"text": "all good"}]}], patch="+fine\n")),
        ],
    )
    shown = invoke(tmp_path / "ep", "--show", "odd")
    assert shown.exit_code == 0, shown.output
    for expected in (
        "\n5\n",
        "plain string content",
        '1\na bare string part\n{"text": 7}\nok',
        "a summary that is not a list",
        "  $ 7",
        '  $ {"command": ["ls", "-la"]}',
        "  $ not json {",
        "listed",
        '{"weird": true}',
        '"a string where an item should be"',
        "42",
        "FAIL_TO_PASS: 0 passed, 0 failed",
    ):
        assert expected in shown.output, expected
    assert "the stored answer is not a /run result" in invoke(tmp_path / "ep", "--show", "odd-answer").output
    assert invoke(tmp_path / "ep", "--show", "odd-output").exit_code == 0
    page = tmp_path / "page.html"
    result = invoke(tmp_path / "ep", "--html", page)
    assert result.exit_code == 0, result.output
    assert page.read_text().count("<details>") == 4 and "all good" in page.read_text()


def test_fields_of_the_wrong_type_still_give_every_view(tmp_path: Path) -> None:
    write_step(
        tmp_path / "ep",
        "train",
        1,
        [
            entry(
                "a",
                None,
                reward=None,
                eval_set=5,
                session_id=["s"],
                record={"turns": "many", "elapsed_s": "slow", "tool_calls": {}, "attempts": [1]},
            ),
            entry("b", None, record=[1, 2]),
            entry("c", None, record={"turns": float("nan"), "elapsed_s": 1e400, "mask_sample": True}),
            entry("d", None, record={"turns": 4, "elapsed_s": 5.0}),
        ],
    )
    table = invoke(tmp_path / "ep")
    assert table.exit_code == 0, table.output
    assert re.split(r"\s{2,}", table.output.splitlines()[1]) == [
        "train",
        "1",
        "4",
        "2",  # b's record is no object: no typed record, so set aside (as the hooks set it aside)
        "100.0%",
        "4.0",
        "5.0",
        "masked 2",  # set aside without a kind: not "failed", an environment episode's verdict
    ]
    for args in (
        ("--show", "a"),
        ("--show", "b"),
        ("--show", "c"),
        ("--kind", "masked"),
        ("--html", tmp_path / "p.html"),
    ):
        result = invoke(tmp_path / "ep", *args)
        assert result.exit_code == 0, (args, result.output)
        no_traceback(result)


def test_numbers_too_large_for_a_float_still_give_every_view(tmp_path: Path) -> None:
    huge = 10**400  # JSON reads it as an int that float() cannot hold
    write_step(
        tmp_path / "ep",
        "train",
        1,
        [
            entry("a", None, reward=huge, finished_at=huge, record={"elapsed_s": huge, "turns": huge}),
            entry("b", None, record={"elapsed_s": 5.0}),
        ],
    )
    for args in ((), ("--show", "a"), ("--list",), ("--html", tmp_path / "p.html"), ("--plots", tmp_path / "plots")):
        result = invoke(tmp_path / "ep", *args)
        assert result.exit_code == 0, (args, result.output)
        no_traceback(result)


DEEP = "[" * 100_000
"""Nested past the JSON parser's recursion limit (a model stuck repeating one character)."""


def test_json_nested_too_deeply_is_skipped_or_shown_as_text_in_every_view(tmp_path: Path) -> None:
    store = EpisodeStore(tmp_path / "store")  # the real writer inlines a JSON answer as it came
    store.add("train", {"episode_id": "good"}, b'{"response": {"output": []}}', True)
    store.add("train", {"episode_id": "deep"}, ('{"x": ' + DEEP + "]" * len(DEEP) + "}").encode(), True)
    store.close()  # not sealed: every view reads the episodes' own lines
    called = run_answer([{"type": "function_call", "name": "bash", "arguments": DEEP}])
    write_step(tmp_path / "tool", "train", 1, [entry("ok", run_answer([])), entry("loop", called)])
    for folder, args in [
        (tmp_path / "store", ()),
        (tmp_path / "store", ("--show", "good")),
        (tmp_path / "store", ("--html", tmp_path / "a.html")),
        (tmp_path / "tool", ("--show", "loop")),
        (tmp_path / "tool", ("--html", tmp_path / "b.html")),
    ]:
        result = invoke(folder, *args)
        assert result.exit_code == 0, (args, result.output)
        no_traceback(result)
    assert "JSON nested too deeply" in invoke(tmp_path / "store").output
    assert DEEP[:50] in invoke(tmp_path / "tool", "--show", "loop").output


def test_rewards_whose_mean_is_past_a_floats_range_still_plot(tmp_path: Path) -> None:
    write_step(tmp_path / "ep", "train", 1, [entry("a", reward=1.7e308), entry("b", reward=1.7e308)])
    write_step(tmp_path / "ep", "train", 2, [entry("c", reward=1.7e308)])
    write_step(tmp_path / "ep", "train", 3, [entry("d", reward=-1.7e308)])
    for args in (("--plots", tmp_path / "plots"), ("--html", tmp_path / "p.html"), ()):
        result = invoke(tmp_path / "ep", *args)
        assert result.exit_code == 0, (args, result.output)
        no_traceback(result)


def test_an_unreadable_step_file_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "ep" / "train" / "step-000001.jsonl").mkdir(parents=True)  # a folder with a step file's name
    for args in ((), ("--html", tmp_path / "p.html"), ("--show", "x")):
        result = invoke(tmp_path / "ep", *args)
        no_traceback(result)
        assert "step-000001.jsonl" in result.output


# ----------------------------------------------------------------------------- a set-aside episode


def test_a_set_aside_episode_shows_what_its_record_knows(tmp_path: Path) -> None:
    url = "https://raw.githubusercontent.com/swe-bench/experiments/main/evaluation/verified/" + "a" * 300
    body = f"HTTP 500 from the sandbox: could not fetch {url} (connection reset by peer) " * 4
    reason = "the server marked the sample as not a valid measurement: could not fetch " + url
    write_step(
        tmp_path / "ep",
        "train",
        1,
        [
            entry(
                "m",
                {"text": body},
                reward=0.0,
                record={
                    "mask_sample": True,
                    "status": "failed",
                    "failure_kind": "sandbox_error",
                    "failure_reason": reason,
                    "turns": 3,
                    "tool_calls": 2,
                    "http_status": 500,
                },
            ),
            entry(
                "n",
                None,
                reward=0.0,
                record={
                    "mask_sample": True,
                    "status": "failed",
                    "failure_kind": "transport",
                    "failure_reason": "connection refused",
                    "turns": None,
                    "tool_calls": None,
                },
            ),
        ],
    )
    out = invoke(tmp_path / "ep", "--show", "m").output
    assert f"failure: sandbox_error: {reason}\n" in out
    assert "in the trajectory the server returned: 3 turns, 2 tool calls\n" in out and "HTTP status 500" in out
    assert body in out  # what came back, whole (it is short enough)
    assert "(no patch: no /run result came back)" in out and "(no test report: no /run result came back)" in out
    nothing = invoke(tmp_path / "ep", "--show", "n").output
    assert "returned: - turns, - tool calls\n" in nothing and "(no patch: nothing came back)" in nothing
    page = tmp_path / "page.html"
    invoke(tmp_path / "ep", "--html", page)
    assert f"failure: sandbox_error: {reason}\n" in page.read_text()


def test_trim_cuts_at_word_ends() -> None:
    from miles_nemogym.store._browser import trim

    text = " ".join(f"word{i:04d}" for i in range(400))
    cut = trim(text, 600)
    head, tail = cut.split("\n… [")[0], cut.split("] …\n")[1]
    assert head.endswith(" ") and text.startswith(head) and tail.startswith("word") and text.endswith(tail)
    assert f"[{len(text) - len(head) - len(tail)} characters cut]" in cut and len(head) + len(tail) <= 600


# ----------------------------------------------------------------------------- filters


@pytest.mark.parametrize(
    "args", [("--step", "-1"), ("--kind", "nosuch"), ("--instance", "x"), ("--kind", "resolved", "--step", "2")]
)
def test_an_empty_filter_result_says_no_episodes_match(tmp_path: Path, args: tuple[str, ...]) -> None:
    write_step(tmp_path / "ep", "train", 1, [entry("a"), entry("b")])
    result = CliRunner().invoke(app, ["episodes", str(tmp_path / "ep"), *args])
    assert result.exit_code == 0
    assert result.stdout == ""  # nothing for a script to read
    assert result.stderr == f"no episodes match {' '.join(args)} (of 2 in {tmp_path / 'ep'})\n"
    page = tmp_path / "p.html"
    assert CliRunner().invoke(app, ["episodes", str(tmp_path / "ep"), *args, "--html", str(page)]).exit_code == 0
    assert not page.exists()


# ----------------------------------------------------------------------------- --html OUT


def refused(store: Path, out: Path | str, message: str) -> None:
    result = CliRunner().invoke(app, ["episodes", str(store), "--html", str(out)])
    no_traceback(result)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: --html "), result.stderr
    assert message in result.stderr


def test_html_refuses_to_write_inside_the_store(one_episode_store: Path) -> None:
    step = one_episode_store / "train" / "step-000001.jsonl"
    before = step.read_bytes()
    refused(one_episode_store, step, "is inside the episode store")
    refused(one_episode_store, one_episode_store / "page.html", "is inside the episode store")
    refused(one_episode_store, one_episode_store / "train" / ".." / "x.html", "is inside the episode store")
    link = one_episode_store.parent / "to-store"
    link.symlink_to(one_episode_store)
    refused(one_episode_store, link / "train" / "step-000001.jsonl", "is inside the episode store")
    assert step.read_bytes() == before and not (one_episode_store / "page.html").exists()


def test_html_refuses_what_is_not_a_regular_file(one_episode_store: Path, tmp_path: Path) -> None:
    refused(one_episode_store, tmp_path, "is a folder")
    refused(one_episode_store, "/dev/full", "is not a regular file")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refused(one_episode_store, fifo, "is not a regular file")
    refused(one_episode_store, tmp_path / "missing" / "page.html", f"the folder {tmp_path / 'missing'} does not exist")
    outside = tmp_path / "secret.txt"
    outside.write_text("keep")
    (tmp_path / "link.html").symlink_to(outside)
    refused(one_episode_store, tmp_path / "link.html", "is a symbolic link")
    (tmp_path / "dangling.html").symlink_to(tmp_path / "nowhere.html")
    refused(one_episode_store, tmp_path / "dangling.html", "is a symbolic link")
    read_only = tmp_path / "read-only.html"
    read_only.write_text("old")
    read_only.chmod(0o444)
    refused(one_episode_store, read_only, "is read-only")
    # A folder no one can create files in:
    refused(one_episode_store, "/sys/episodes.html", "cannot write /sys/episodes.html: ")
    assert outside.read_text() == "keep" and read_only.read_text() == "old" and not (tmp_path / "nowhere.html").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dangling.html",
        "ep",
        "fifo",
        "link.html",
        "read-only.html",
        "secret.txt",
    ]


def test_html_replaces_the_page_by_rename(one_episode_store: Path, tmp_path: Path) -> None:
    page = tmp_path / "page.html"
    page.write_text("old page")
    other_name = tmp_path / "hard-link.html"
    os.link(page, other_name)  # written in place, the old page's other name would change too
    old = os.umask(0o022)
    try:
        result = invoke(one_episode_store, "--html", page)
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    assert page.read_text().startswith("<!doctype html>") and page.read_text().endswith("</html>")
    assert other_name.read_text() == "old page"
    assert stat.S_IMODE(page.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ep", "hard-link.html", "page.html"]  # no temporary left


def test_a_set_aside_episode_shows_the_servers_whole_error_its_policy_calls_and_trajectory(
    tmp_path: Path, gym_example_rollouts: list[dict[str, Any]]
) -> None:
    """As smoke stores a django row graded without network: the record's reason is cut, the
    answer has the server's error whole, smoke counted the policy calls and found the file."""
    cause = (
        "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='raw.githubusercontent.com', port=443): "
        "Max retries exceeded with url: /django/django/419a78300f7cd27611196e1e464d50fd0385ff27/tests/requirements/"
        "py3.txt (Caused by NameResolutionError(\"HTTPSConnection(host='raw.githubusercontent.com', port=443): "
        "Failed to resolve 'raw.githubusercontent.com' ([Errno -3] Temporary failure in name resolution)\"))"
    )
    error = "\x1b[36mray::runner_ray_remote()\x1b[39m (pid=1, ip=127.0.0.1)\n" + '  File "x.py", line 1\n' * 3 + cause
    crashed = {**gym_example_rollouts[0], "reward": 0.0, "metadata": {"error": error, "traceback": "T"}}
    crashed["response"] = {**crashed["response"], "output": []}
    record = classify_http(200, json.dumps(crashed).encode()).record
    assert record.failure_reason is not None and cause not in record.failure_reason  # the record's line is cut
    trajectory = "/tmp/smoke/gym/results/verified/model/repo__x-1/repo__x-1_1_u.traj.json"
    line = entry(
        "e1",
        crashed,
        reward=0.0,
        record=record.model_dump(mode="json"),
        policy_calls=3,
        server_trajectory=trajectory,
    )
    write_step(tmp_path / "ep", "train", 0, [line])
    shown = invoke(tmp_path / "ep", "--show", "e1").output
    assert cause in shown  # whole, on one line
    assert "requests the policy answered (counted by the run, not the server): 3\n" in shown
    assert f"the server's trajectory file: {trajectory}" in shown
    assert "\x1b" not in shown
    done = invoke(tmp_path / "ep", "--html", tmp_path / "page.html")
    assert done.exit_code == 0, done.output
    page = html.unescape((tmp_path / "page.html").read_text(encoding="utf-8"))
    assert cause in page and trajectory in page
    assert "requests the policy answered (counted by the run, not the server): 3" in page
