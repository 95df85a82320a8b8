"""One config for every surface: nearrec.StoreConfig mirrors the Rust StoreConfig (its fields
and defaults are Rust's), round-trips through TOML, refuses unknown keys and bad values by
name, and the same file drives Python and the command line, whose flags override it."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

import nearrec
import nearrec.cli
from nearrec import _native
from nearrec.config import CachePolicy
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


def test_the_cache_policies_are_rusts():
    """CachePolicy's names are written once in Python; Rust (nearrec_cache::Policy) is the
    truth: each is a policy Rust takes, and an unknown name's error lists exactly these."""
    names = [p.value for p in CachePolicy]
    for policy in CachePolicy:
        for given in (policy, policy.value):  # the member or its plain name
            c = nearrec.StoreConfig(cache_policy=given)
            assert f'cache_policy = "{policy.value}"' in c.to_toml()
            assert nearrec.StoreConfig.from_toml(c.to_toml()).cache_policy == policy
    with pytest.raises(InvalidRequest, match="cache_policy") as e:
        nearrec.StoreConfig(cache_policy="fifo")
    listed = str(e.value).split("expected one of", 1)[1]
    assert re.findall(r"`(\w+)`", listed) == names
    # the helpers, as Rust's Policy::frequency / probabilistic answer
    assert [p.frequency for p in CachePolicy] == [False, True, False, True]
    assert [p.probabilistic for p in CachePolicy] == [False, False, True, True]


def test_one_cache_policy_type_for_the_store_and_the_gpu_tier():
    pytest.importorskip("torch")
    import nearrec.gpu
    import nearrec.gpu.config

    assert nearrec.gpu.CachePolicy is nearrec.gpu.config.CachePolicy is CachePolicy
    config = nearrec.gpu.GpuCacheConfig(slots=64, policy="lru_pa").validate()
    assert config.cache_policy is CachePolicy.LRU_PA
    with pytest.raises(InvalidRequest, match="cache_policy must be one of"):
        nearrec.gpu.GpuCacheConfig(slots=64, policy="mru").validate()


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
