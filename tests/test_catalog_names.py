"""Catalog names as ``gym list environments`` prints them, the short names users already type,
and the closest names for a name the catalog does not have."""

from __future__ import annotations

import pytest

from miles_nemogym.gym.catalog import CatalogDataset, CatalogEntry, UnknownCatalogNameError, find

ENTRIES = (
    CatalogEntry(name="resources_servers/mcqa", kind="environment", config="resources_servers/mcqa/configs/mcqa.yaml"),
    CatalogEntry(name="resources_servers/arena/lmarena_v2", kind="environment", config="a.yaml"),
    CatalogEntry(name="resources_servers/arena/lmarena_v3", kind="environment", config="b.yaml"),
    CatalogEntry(name="calendar_v2", kind="environment", config="environments/calendar_v2/config.yaml"),
    CatalogEntry(
        name="aime25",
        kind="benchmark",
        config="benchmarks/aime25/config.yaml",
        datasets=(CatalogDataset(name="aime25", type="benchmark", num_repeats=32),),
    ),
    CatalogEntry(name="twin", kind="environment", config="c.yaml"),
    CatalogEntry(name="twin", kind="benchmark", config="d.yaml"),
)


@pytest.mark.parametrize(
    ("said", "found"),
    [
        ("resources_servers/mcqa", "resources_servers/mcqa"),
        ("mcqa", "resources_servers/mcqa"),
        ("MCQA", "resources_servers/mcqa"),
        ("calendar_v2", "calendar_v2"),
        ("aime25", "aime25"),
        ("resources_servers/arena/lmarena_v3", "resources_servers/arena/lmarena_v3"),
    ],
)
def test_a_catalog_name_or_a_short_name_finds_its_entry(said: str, found: str) -> None:
    assert find(said, ENTRIES).name == found


def test_a_benchmark_carries_its_repeats_and_an_environment_has_none() -> None:
    assert find("aime25", ENTRIES).num_repeats == 32
    assert find("mcqa", ENTRIES).num_repeats is None


def test_a_server_with_several_configs_names_each_config() -> None:
    with pytest.raises(UnknownCatalogNameError) as raised:
        find("arena", ENTRIES)
    assert "resources_servers/arena/lmarena_v2, resources_servers/arena/lmarena_v3" in str(raised.value)


def test_an_unknown_name_gets_the_closest_catalog_names_case_ignored() -> None:
    with pytest.raises(UnknownCatalogNameError, match=r"did you mean calendar_v2\?"):
        find("Calendar_V3", ENTRIES)
    with pytest.raises(UnknownCatalogNameError, match="no catalog name is close"):
        find("zzzz", ENTRIES)


def test_a_name_of_two_kinds_asks_for_the_kind_and_the_kind_picks_one() -> None:
    with pytest.raises(UnknownCatalogNameError, match="--kind environment and --kind benchmark"):
        find("twin", ENTRIES)
    assert find("twin", ENTRIES, kind="benchmark").config == "d.yaml"
