"""Stands in for ``gym.server.GymServer`` in smoke runs (the real one needs its Python 3.13
environment): a loopback ``/run`` server answering each instance with nemo-gym's own result
for it, writing the trajectory file where ``mini_swe_agent_2`` writes it (nemo-gym 0.7.0:
``results/<subset>/<policy model>/<id>/<id>_<time>_<uuid>.traj.json`` under its folder)."""

from __future__ import annotations

import time
import uuid
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, ClassVar

from aiohttp import web

from miles_nemogym.gym import wheel as gym_wheel
from tests.support.fault_server import FaultServer, crashed_result, result_for
from tests.support.threaded import serving_in_thread

CRASH_CAUSE = (
    "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='raw.githubusercontent.com', port=443): Max "
    "retries exceeded with url: /django/django/419a78300f7cd27611196e1e464d50fd0385ff27/tests/requirements/py3.txt "
    "(Caused by NameResolutionError(\"HTTPSConnection(host='raw.githubusercontent.com', port=443): Failed to "
    "resolve 'raw.githubusercontent.com' ([Errno -3] Temporary failure in name resolution)\"))"
)
"""The last line of the server's error when an eval script cannot download its requirements."""


class LoopbackGym:
    """Class settings (set them with ``monkeypatch``): ``policy_calls`` each episode makes on its
    ``policy_base_url``; ``crashed`` instances answered as the real server answers an eval that
    raised (reward 0.0, no output, ``metadata.error``)."""

    servers: ClassVar[list[FaultServer]] = []
    policy_calls: ClassVar[int] = 0
    crashed: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, options: Any, *, state_dir: Path, venv: Any, progress: Any) -> None:
        self.results_dir, self.log_path = state_dir / "results", state_dir / "server.log"
        self._serving: AbstractContextManager[FaultServer] | None = None
        self._rollouts = {r["instance_id"]: r for r in gym_wheel.example_rollouts()}

    def _answer(self, body: dict[str, Any]) -> web.Response:
        instance = str(body["instance_id"])
        name = instance.lower()
        folder = self.results_dir / "Verified" / "policy" / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}_{int(time.time())}_{uuid.uuid4()}.traj.json").write_text('{"messages": []}')
        result = self._rollouts[instance]
        if instance in self.crashed:
            error = 'ray::runner_ray_remote() (pid=1, ip=127.0.0.1)\n  File "app.py", line 1\n' + CRASH_CAUSE
            return web.json_response(crashed_result(result, instance, error, "Traceback ..."))
        return web.json_response(result_for(result, instance))

    def __enter__(self) -> LoopbackGym:
        server = FaultServer.of_results(list(self._rollouts.values()), policy_calls=self.policy_calls)
        server.respond = self._answer
        self._serving = serving_in_thread(server)
        self.server = self._serving.__enter__()
        LoopbackGym.servers.append(self.server)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._serving is not None
        self._serving.__exit__(*exc)

    @property
    def url(self) -> str:
        return self.server.url
