"""GRPO on SWE-bench with Miles and NeMo-Gym's mini_swe_agent_2 (4-GPU recipe; fully async
and disaggregated with --fully-async).

    NEMO_GYM_URL=http://<gym-host>:12000 python examples/swebench_grpo/run.py
    python examples/swebench_grpo/run.py --config examples/swebench_grpo/recipe.yaml --dry-run
    python examples/swebench_grpo/run.py --num-rollout 100 --mode debug_rollout_only
    python examples/swebench_grpo/run.py --fully-async --actor-gpus-per-node 2 --rollout-num-gpus 2

All logic lives in ``miles_nemogym.launcher`` (installed from the clone with ``pip
install -e '.[train]'``); see README.md next to this file.
"""

from __future__ import annotations

import sys

from miles_nemogym.launcher.run import main

if __name__ == "__main__":
    sys.exit(main())
