"""One YAML-mapping reader: the launcher's --config and serve's --provider-config refuse a bad file alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from miles_nemogym.gym.config import load_provider_options
from miles_nemogym.gym.venv import GymEnvironmentError
from miles_nemogym.launcher._config import ConfigError, read_yaml


@pytest.mark.parametrize(
    ("content", "launcher_says", "serve_says"),
    [
        (
            b"\xff\xfe\x00",
            "not UTF-8 text (a binary file, or saved as UTF-16?); save the recipe as UTF-8 YAML",
            "not UTF-8 text (a binary file, or saved as UTF-16?); give a YAML file saved as UTF-8",
        ),
        (
            b"- a\n- list\n",
            "expected a mapping of settings, got list",
            "expected a mapping of provider options (e.g. `exec: {default_timeout_s: 300}`), got list",
        ),
        (b"a: [unclosed\n", "not valid YAML (", "not valid YAML ("),
    ],
)
def test_both_readers_say_the_same_with_their_flag_and_fix(
    tmp_path: Path, content: bytes, launcher_says: str, serve_says: str
) -> None:
    path = tmp_path / "file.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as launcher:
        read_yaml(path)
    with pytest.raises(GymEnvironmentError) as serve:
        load_provider_options(path)
    assert str(launcher.value).startswith(f"--config {path}: {launcher_says}")
    assert str(serve.value).startswith(f"--provider-config {path}: {serve_says}")


def test_an_empty_file_is_an_empty_mapping_and_dashes_read_like_flags(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert read_yaml(empty) == {} and load_provider_options(empty) == {}
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("num-rollout: 3\n")
    assert read_yaml(recipe) == {"num_rollout": 3}
