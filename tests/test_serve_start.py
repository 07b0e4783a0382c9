"""``serve`` starting its server for real (a subprocess, the stand-in server of ``tests/support/stand_in_gym``):
Ready only when the server it started answers, and no empty folder left when the start fails."""

from __future__ import annotations

import asyncio
import http.server
import subprocess
import sys
import threading
from pathlib import Path
from typing import ClassVar

from tests.support.eventually import eventually
from tests.support.ports import free_port
from tests.support.serve_process import exported, serving
from tests.support.stand_in_gym import stand_in_env


def _serve(env: dict[str, str], *arguments: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "miles_nemogym.cli.main", "serve", "--sandbox", "local", *arguments]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


class _Stranger(http.server.BaseHTTPRequestHandler):
    asked: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.asked.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_stranger_answering_on_the_port_is_not_taken_for_the_started_server(tmp_path: Path) -> None:
    # A second serve said Ready and printed the export line: its health check reached another server.
    port = free_port()
    env = stand_in_env(tmp_path, "never-listens")
    process = _serve(env, "--port", str(port), "--start-timeout", "3")
    try:
        asyncio.run(eventually((tmp_path / "events" / "started").exists, "serve started its server"))
        stranger = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Stranger)
        threading.Thread(target=stranger.serve_forever, daemon=True).start()
        try:
            assert process.stdout is not None
            lines = []
            for line in process.stdout:  # until it exits, or says it waits for Ctrl-C (the failure)
                lines.append(line)
                if line.startswith("Press Ctrl-C"):
                    break
            said = "".join(lines)
            assert "Ready" not in said, said
            process.wait(timeout=60)
        finally:
            stranger.shutdown()
            stranger.server_close()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 1, said
    assert _Stranger.asked, "the stranger was never asked: the test did not reach the health check"
    flat = " ".join(said.split())
    assert f"another program answers on http://127.0.0.1:{port}, not the NeMo-Gym server serve started" in flat
    assert "✓ starting" not in said and "Ready" not in said and "export" not in said
    assert list((tmp_path / "temp").iterdir()) == []  # an empty log: no folder kept


def test_the_server_serve_started_is_ready_and_stopping_removes_its_folder(tmp_path: Path) -> None:
    port = free_port()
    env = stand_in_env(tmp_path, "serve")
    with serving("--sandbox", "local", "--port", str(port), env=env) as started:
        assert "Ready in" in started.printed, started.printed
        assert exported(started.printed)["NEMO_GYM_URL"] == f"http://127.0.0.1:{port}"
        rest = started.stop()
    assert "stopped; removed" in rest
    assert list((tmp_path / "temp").iterdir()) == []


def test_a_failed_start_keeps_its_folder_only_when_the_log_says_something(tmp_path: Path) -> None:
    silent, loud = tmp_path / "silent", tmp_path / "loud"
    for root, mode in ((silent, "exit-silent"), (loud, "exit-loud")):
        root.mkdir()
        process = _serve(stand_in_env(root, mode), "--port", "0")
        said, _ = process.communicate(timeout=120)
        assert process.returncode == 1, said
        assert "exited during start" in said and "Ready" not in said and "✓ starting" not in said
        if root is silent:
            assert "kept" not in said and list((root / "temp").iterdir()) == []
    [made] = (loud / "temp").iterdir()
    assert f"kept {made} (the logs) to look at" in " ".join(said.split())
    assert "the reason a user reads in the log" in (made / "server.log").read_text()
    assert "cannot start [notice] [/usr/lib] (the reason" in said  # the log's tail, shown as written
