"""For the launcher tests: a Miles checkout stand-in and argv parsing.

The stand-in checkout has only the files the launcher reads: ``train.py``,
``train_async.py``, the agentic generate and fully async rollout modules' files, a
model-arguments script and a loader with the interface of Miles'
``model_args_utils.load_model_args(model_type) -> str`` (written here, not copied from Miles).
"""

from __future__ import annotations

from pathlib import Path

MODEL_TYPE = "qwen3-4B-Instruct-2507"
MODEL_ARGS = ("--num-layers", "36", "--hidden-size", "2560", "--moe-layer-freq", "[1,1]")

_LOADER = """
import importlib.util
from pathlib import Path


def load_model_args(model_type):
    path = Path(__file__).resolve().parents[3] / "scripts" / "models" / f"{model_type}.py"
    assert path.exists(), f"no model args script at {path}"
    spec = importlib.util.spec_from_file_location("model_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return " ".join(module.model_args().split())
"""


def make_miles_checkout(root: Path, model_type: str = MODEL_TYPE) -> Path:
    """A stand-in Miles checkout at ``root`` whose model-args script for ``model_type`` gives ``MODEL_ARGS``."""
    (root / "miles" / "rollout" / "generate_hub").mkdir(parents=True)
    (root / "miles" / "utils" / "external_utils").mkdir(parents=True)
    (root / "scripts" / "models").mkdir(parents=True)
    (root / "tools").mkdir()
    (root / "train.py").write_text("raise SystemExit('stand-in')\n")
    (root / "train_async.py").write_text("raise SystemExit('stand-in')\n")
    (root / "miles" / "rollout" / "fully_async_rollout.py").write_text("")
    (root / "tools" / "convert_hf_to_torch_dist.py").write_text("")
    (root / "miles" / "rollout" / "generate_hub" / "agentic_tool_call.py").write_text("")
    (root / "miles" / "utils" / "external_utils" / "model_args_utils.py").write_text(_LOADER)
    args = " ".join(MODEL_ARGS)
    (root / "scripts" / "models" / f"{model_type}.py").write_text(f"def model_args():\n    return '''{args}\n'''\n")
    return root


def flag_values(argv: list[str]) -> dict[str, list[str]]:
    """``--flag`` -> the tokens after it up to the next flag (empty for switches)."""
    values: dict[str, list[str]] = {}
    current: str | None = None
    for token in argv:
        if token.startswith("--"):
            assert token not in values, f"{token} appears twice"
            values[token] = []
            current = token
        elif current is not None:
            values[current].append(token)
    return values
