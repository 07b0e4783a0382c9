"""Run episodes the way a Miles rollout process does, then exit without any cleanup.

Miles runs its asyncio loop forever on a daemon thread (``miles/utils/async_utils.py``
at commit 31f1ca9: ``AsyncLoopThread``) and submits coroutines to it with
``run_coroutine_threadsafe``; nothing closes that loop at exit. This script does the
same (a loopback ``/run`` server included) and prints one status per episode; the test
reads its stderr for aiohttp's "Unclosed ..." warnings.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading

from miles_nemogym import agent
from miles_nemogym.gym import wheel as gym_wheel
from tests.support.fault_server import FaultServer


def main() -> None:
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    row = gym_wheel.example_rows()[0]
    result = next(r for r in gym_wheel.example_rollouts() if r["instance_id"] == row["instance_id"])
    server = asyncio.run_coroutine_threadsafe(FaultServer(result=result).start(), loop).result(30)
    os.environ["NEMO_GYM_URL"] = server.url

    async def episodes() -> list[dict[str, object]]:
        calls = [agent.run(base_url="http://127.0.0.1:1/sessions/s", metadata=row) for _ in range(int(sys.argv[1]))]
        return await asyncio.gather(*calls)

    outs = asyncio.run_coroutine_threadsafe(episodes(), loop).result(60)
    print(" ".join(str(out["nemogym"]["status"]) for out in outs), flush=True)  # type: ignore[index]


if __name__ == "__main__":
    main()
