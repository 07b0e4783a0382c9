"""The launcher tests' helpers (``tests/support/miles_checkout.py``) behave as the tests assume."""

from __future__ import annotations

from pathlib import Path

from tests.support.miles_checkout import MODEL_ARGS, MODEL_TYPE, flag_values, make_miles_checkout


def test_model_args_come_from_the_checkouts_loader(tmp_path: Path) -> None:
    from miles_nemogym.launcher.run import ModelArgsError, load_model_args

    root = make_miles_checkout(tmp_path / "miles")
    assert load_model_args(root, MODEL_TYPE) == MODEL_ARGS
    try:
        load_model_args(root, "no-such-model")
    except ModelArgsError as error:
        assert "no-such-model" in str(error)
    else:
        raise AssertionError("a missing model script must be an error")


def test_flag_values_rejects_repeats() -> None:
    assert flag_values(["--a", "1", "--b", "--c", "x", "y"]) == {"--a": ["1"], "--b": [], "--c": ["x", "y"]}
    try:
        flag_values(["--a", "--a"])
    except AssertionError as error:
        assert "--a" in str(error)
    else:
        raise AssertionError("a repeated flag must be reported")
