"""Where the tests find Miles' source (MILES_SRC or the pinned clone), and the env's cache key."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from miles_nemogym.pins import MILES_COMMIT
from tests.support import miles_env
from tests.support.miles_env import MilesEnvironmentError, megatron_source, miles_source, venv_key


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MILES_NEMOGYM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def fake_miles(root: Path) -> Path:
    (root / "miles" / "rollout").mkdir(parents=True)
    (root / "miles" / "__init__.py").write_text("")
    return root


def test_a_checkout_is_used_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = fake_miles(tmp_path / "miles-checkout")
    monkeypatch.setenv("MILES_SRC", str(tree))
    assert miles_source(progress=lambda _: None) == tree.resolve()


def test_an_archive_is_extracted_once_into_the_cache(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = fake_miles(tmp_path / "miles-31f1ca96")
    archive = tmp_path / "miles.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname="miles-31f1ca96")
    monkeypatch.setenv("MILES_SRC", str(archive))
    lines: list[str] = []
    first = miles_source(progress=lines.append)
    second = miles_source(progress=lines.append)
    assert first == second and first.name == "miles-31f1ca96" and (first / "miles" / "rollout").is_dir()
    assert first.is_relative_to(cache / "miles-src")
    assert sum(line.startswith("extracting") for line in lines) == 1


@pytest.mark.parametrize("make", ["empty_dir", "text_file", "archive_without_miles"])
def test_a_wrong_miles_src_names_the_variable_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: str
) -> None:
    target = tmp_path / "x"
    if make == "empty_dir":
        target.mkdir()
    elif make == "text_file":
        target.write_text("not an archive")
    else:
        target = tmp_path / "x.tar.gz"
        (tmp_path / "other").mkdir()
        with tarfile.open(target, "w:gz") as tar:
            tar.add(tmp_path / "other", arcname="other")
    monkeypatch.setenv("MILES_SRC", str(target))
    with pytest.raises(MilesEnvironmentError, match=r"MILES_SRC=.*(checkout|\.tar\.gz)"):
        miles_source(progress=lambda _: None)


def test_without_miles_src_or_git_the_message_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MILES_SRC", raising=False)
    monkeypatch.setattr(miles_env.shutil, "which", lambda name: None)
    with pytest.raises(
        MilesEnvironmentError, match=r"set MILES_SRC to a checkout or a \.tar\.gz of .* at 31f1ca961a94, or install git"
    ):
        miles_source(progress=lambda _: None)


def test_the_env_is_keyed_by_every_pin() -> None:
    assert venv_key() == f"py3.11-miles{MILES_COMMIT[:12]}-torch2.13.0-sglang0.5.22-transformers5.12.1-r1"


def megatron_archive(tmp_path: Path, folders: tuple[str, ...]) -> Path:
    tree = tmp_path / "megatron-lm-2e64d788b67f"
    for folder in folders:
        (tree / folder).mkdir(parents=True)
    archive = tmp_path / "megatron.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname=tree.name)
    return archive


def test_a_megatron_archive_is_used_with_its_miles_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEGATRON_SRC", str(megatron_archive(tmp_path, ("megatron/training", "miles_megatron_plugins"))))
    tree = megatron_source(progress=lambda _: None)
    assert tree.name == "megatron-lm-2e64d788b67f" and (tree / "miles_megatron_plugins").is_dir()


def test_a_megatron_tree_without_miles_plugins_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEGATRON_SRC", str(megatron_archive(tmp_path, ("megatron/training",))))
    with pytest.raises(
        MilesEnvironmentError, match=r"MEGATRON_SRC=.* \(no megatron/training and miles_megatron_plugins"
    ):
        megatron_source(progress=lambda _: None)
