"""One config for every surface: nearrec.StoreConfig mirrors the Rust StoreConfig (its fields
and defaults are Rust's), round-trips through TOML, refuses unknown keys and bad values by
name, and the same file drives Python and the command line, whose flags override it."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import nearrec
import nearrec.cli
from nearrec import _native
from nearrec.errors import InvalidRequest


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    p = tmp_path_factory.mktemp("config") / "s"
    rng = np.random.default_rng(1)
    nearrec.from_numpy(p, {"a": rng.standard_normal((300, 8), dtype=np.float32),
                           "b": rng.standard_normal((200, 4), dtype=np.float32)})
    return p


def test_the_python_config_mirrors_rusts_fields_and_defaults():
    rust = json.loads(_native.StoreConfig().to_json())
    py = {f.name: f.default for f in dataclasses.fields(nearrec.StoreConfig)}
    assert set(rust) <= set(py)  # Rust leaves out the optional settings that are unset
    assert {k for k, v in py.items() if v is not None} == set(rust)
    for k, v in rust.items():
        assert py[k] == v, k
    assert nearrec.StoreConfig().tier == "auto"


def test_toml_round_trip_and_the_file_is_rusts():
    c = nearrec.StoreConfig(tier="ssd", dram_budget="64MiB", cache_policy="lru", cache_ways=8,
                            plan={"a": {"resident": True}, "b": {"hot_rows": [1, 2],
                                                                 "cache_bytes": "4KiB"}})
    text = c.to_toml()
    assert 'tier = "ssd"' in text and "dram_budget = 67108864" in text
    back = nearrec.StoreConfig.from_toml(text)
    assert back.to_toml() == text
    assert back.dram_budget == 64 << 20 and back.cache_ways == 8


@pytest.mark.parametrize("text,key", [
    ('tier = "ssd"\ncache_polcy = "lru"', "cache_polcy"),
    ("io_queue_depth = 0", "io_queue_depth"),
    ('dram_budget = "lots"', "dram_budget"),
    ("[plan.tables.a]\nresidnt = true", "residnt"),
])
def test_a_typo_or_a_bad_value_is_named(text, key):
    with pytest.raises(InvalidRequest, match=key):
        nearrec.StoreConfig.from_toml(text)


def test_keyword_settings_are_checked_by_name(path):
    with pytest.raises(InvalidRequest, match="cache_polcy"):
        nearrec.open(path, cache_polcy="lru")
    with pytest.raises(InvalidRequest, match="threads"):
        nearrec.StoreConfig(threads=-1)
    with pytest.raises(InvalidRequest, match="replace"):
        nearrec.StoreConfig().replace(replace=1)


def test_open_takes_a_config_and_keyword_overrides(path, tmp_path):
    file = tmp_path / "store.toml"
    file.write_text('tier = "ssd"\ndram_budget = "16KiB"\n')
    config = nearrec.StoreConfig.from_file(file)
    s = nearrec.open(path, config)
    assert s.tier == "ssd" and s.config.dram_budget == 16 << 10
    assert nearrec.open(path, config, tier="dram").tier == "dram"
    with pytest.raises(InvalidRequest, match="config"):
        nearrec.open(path, config="store.toml")


def _lookup(argv, capsys):
    assert nearrec.cli.main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_the_cli_reads_the_same_file_and_its_flags_override_it(path, tmp_path, capsys):
    file = tmp_path / "store.toml"
    file.write_text('tier = "ssd"\ncache_policy = "lru"\n')
    base = ["lookup", str(path), "--repeat", "2", "--batch", "4", "--json"]
    on_ssd = _lookup(base + ["--config", str(file)], capsys)
    assert on_ssd["stats"]["device"] in ("io_uring", "pread")
    in_dram = _lookup(base + ["--config", str(file), "--tier", "dram"], capsys)
    assert "stats" not in in_dram
    assert in_dram["first_row"] == pytest.approx(on_ssd["first_row"], rel=1e-5, abs=1e-5)
    # with neither, lookup opens as open() does: tier auto (this small store: DRAM)
    assert "stats" not in _lookup(base, capsys)
    file.write_text("tier = 3\n")
    assert nearrec.cli.main(base + ["--config", str(file)]) != 0
    assert "tier" in capsys.readouterr().err
