"""A cached NeMo-Gym server venv whose ``mini_swe_agent_2`` server is a stand-in, for ``serve`` and
``smoke`` run as real subprocesses without the Python 3.13 environment.

Its "python" stands in for nemo-gym's config parser (each payload back as it came) and runs the stand-in
``app.py`` with this interpreter. The stand-in does what ``STAND_IN_MODE`` says and touches
``STAND_IN_EVENTS/<event>`` as it goes (``started``, ``run``), so a test waits on real events.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from miles_nemogym.gym.config import AGENT_CONFIG, MODEL_CONFIG
from miles_nemogym.gym.venv import AGENT_RELATIVE_DIR, READY_MARKER, venv_key
from miles_nemogym.gym.wheel import wheel_path
from tests.support.scripts import shell_script

_APP = """
import http.server, json, os, sys, threading
from pathlib import Path

events = Path(os.environ["STAND_IN_EVENTS"])
events.mkdir(parents=True, exist_ok=True)
mode = os.environ["STAND_IN_MODE"]
(events / "started").touch()
if mode == "exit-silent":
    sys.exit(1)
if mode == "exit-loud":
    # Brackets as pip's and paths' log lines have them: text, never Rich markup.
    print("stand-in: cannot start [notice] [/usr/lib] (the reason a user reads in the log)", flush=True)
    sys.exit(1)
if mode == "never-listens":
    threading.Event().wait()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def do_POST(self):
        (events / "run").touch()
        threading.Event().wait()  # an episode that takes its time


def port_of(config):
    found = [port_of(value) for value in config.values() if isinstance(value, dict)] if isinstance(config, dict) else []
    return config.get("port") or next(filter(None, found), None)


port = port_of(json.loads(os.environ["NEMO_GYM_CONFIG_DICT"]))
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def wheel_only_cache(root: Path) -> Path:
    """A package cache (``MILES_NEMOGYM_CACHE``) under ``root`` holding the pinned wheel (linked) and
    no server venv: a machine where nothing has built it yet."""
    cache = root / "cache"
    (cache / "wheels").mkdir(parents=True)
    (cache / "wheels" / wheel_path().name).symlink_to(wheel_path())
    return cache


def stand_in_cache(root: Path) -> Path:
    """:func:`wheel_only_cache` and a ready server venv for ``--sandbox local`` whose server is the stand-in."""
    cache = wheel_only_cache(root)
    venv = cache / "gym-venv" / venv_key("local")
    agent = venv / "lib" / "site-packages" / AGENT_RELATIVE_DIR
    agent.mkdir(parents=True)
    (agent / "app.py").write_text(_APP)
    for config in (AGENT_CONFIG, MODEL_CONFIG):  # the parser is a stand-in: only their presence is checked
        (venv / "lib" / "site-packages" / config).parent.mkdir(parents=True, exist_ok=True)
        (venv / "lib" / "site-packages" / config).touch()
    (venv / READY_MARKER).write_text(json.dumps({"site_packages": "lib/site-packages", "python": ""}))
    # nemo-gym's parser: each payload back as its YAML (JSON is YAML), so the stand-in finds its port.
    echo = "import json, sys; print(json.dumps([{'yaml': json.dumps(p)} for p in json.load(sys.stdin)]))"
    parser = f'if [ "$1" = "-c" ]; then exec "{sys.executable}" -c "{echo}"; fi'
    shell_script(venv / "bin" / "python", f'{parser}\nexec "{sys.executable}" "$@"')
    return cache


def stand_in_env(root: Path, mode: str) -> dict[str, str]:
    """This process's environment for a ``serve``/``smoke`` subprocess using :func:`stand_in_cache`,
    its temp folder ``root/temp`` (returned empty) and its events in ``root/events``."""
    (root / "temp").mkdir()
    return {
        **os.environ,
        "MILES_NEMOGYM_CACHE": str(stand_in_cache(root)),
        "TMPDIR": str(root / "temp"),
        "STAND_IN_EVENTS": str(root / "events"),
        "STAND_IN_MODE": mode,
        "COLUMNS": "1000",
    }
