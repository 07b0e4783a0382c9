"""The scan tests' ``/run`` stand-in (``tests/support/fake_gym.py``) answers like the real server."""

from __future__ import annotations

import json
from typing import Any

from tests.support.fake_gym import FakeGym


def test_fake_gym_answers_with_the_real_rollouts(fake_gym: FakeGym, gym_example_rollouts: list[dict[str, Any]]) -> None:
    import urllib.request

    row = gym_example_rollouts[0]
    request = urllib.request.Request(
        f"{fake_gym.url}/run",
        data=json.dumps({"instance_id": row["instance_id"], "responses_create_params": {"input": []}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer = json.loads(response.read())
    assert answer == row
    assert fake_gym.received_ids() == [row["instance_id"]]
