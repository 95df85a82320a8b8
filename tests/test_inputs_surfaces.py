"""Issue 23 item 13 for nearrec.torch, nearrec.datasets and nearrec.simulate: a bad argument or
input file raises a typed nearrec error (an ``InvalidRequest``, ``InvalidTrace``,
``StoreNotFound`` / ``StoreIOError`` or ``UnknownTable``) naming what was wrong, never a bare
TypeError, AttributeError, OverflowError, JSONDecodeError, UnpicklingError, EOFError..."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import nearrec
from nearrec import datasets
from nearrec import simulate as sim
from nearrec.errors import (
    InvalidRequest,
    InvalidTrace,
    NearrecError,
    StoreIOError,
    StoreNotFound,
    UnknownTable,
)

torch = pytest.importorskip("torch")
ntorch = pytest.importorskip("nearrec.torch")

Case = tuple[str, Callable[[Any], Any], type[NearrecError], str]


def _raises(fn: Callable[[], Any], error: type[NearrecError], word: str) -> None:
    with pytest.raises(error) as info:
        fn()
    assert isinstance(info.value, NearrecError)
    assert word.lower() in str(info.value).lower(), str(info.value)


# --- nearrec.torch --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("surfaces") / "s"
    nearrec.from_numpy(path, {"a": rng.standard_normal((20, 4), dtype=np.float32),
                              "b": rng.standard_normal((30, 8), dtype=np.float32)})
    store = nearrec.open(path)
    keyed = nearrec.keyed.KeyedTable("k", 4, 16, unknown="zero")
    return {"store": store, "keyed": keyed}


def _kjt() -> Any:
    return ntorch.KeyedJaggedTensor(["a", "b"], torch.tensor([1, 2, 3]),
                                    lengths=torch.tensor([1, 0, 1, 1]))


TORCH_CASES: list[Case] = [
    ("padding_idx True", lambda e: ntorch.EmbeddingBag(e["store"], "a", padding_idx=True),
     InvalidRequest, "padding_idx"),
    ("padding_idx float", lambda e: ntorch.EmbeddingBag(e["store"], "a", padding_idx=1.5),
     InvalidRequest, "padding_idx"),
    ("padding_idx str", lambda e: ntorch.EmbeddingBag(e["store"], "a", padding_idx="1"),
     InvalidRequest, "padding_idx"),
    ("include_last_offset str",
     lambda e: ntorch.EmbeddingBag(e["store"], "a", include_last_offset="no"),
     InvalidRequest, "include_last_offset"),
    ("keyed forward None", lambda e: ntorch.KeyedEmbeddingBag(e["keyed"])(None),
     InvalidRequest, "input"),
    ("keyed forward list", lambda e: ntorch.KeyedEmbeddingBag(e["keyed"])([1, 2]),
     InvalidRequest, "offsets"),
    ("keyed forward 3-D",
     lambda e: ntorch.KeyedEmbeddingBag(e["keyed"])(torch.zeros((1, 1, 1), dtype=torch.int64)),
     InvalidRequest, "2-D"),
    ("keyed not a table", lambda e: ntorch.KeyedEmbeddingBag("k"),
     InvalidRequest, "KeyedTable"),
    ("ebc feature_names list",
     lambda e: ntorch.EmbeddingBagCollection(e["store"], feature_names=["a", "b"]),
     InvalidRequest, "feature_names"),
    ("ebc bad device", lambda e: ntorch.EmbeddingBagCollection(e["store"], device="nodevice"),
     InvalidRequest, "device"),
    ("ebc device int list", lambda e: ntorch.EmbeddingBagCollection(e["store"], device=[0]),
     InvalidRequest, "device"),
    ("ebc forward None", lambda e: ntorch.EmbeddingBagCollection(e["store"])(None),
     InvalidRequest, "KeyedJaggedTensor"),
    ("ebc forward dict", lambda e: ntorch.EmbeddingBagCollection(e["store"])({"a": [1]}),
     InvalidRequest, "KeyedJaggedTensor"),
    ("ebc tables str", lambda e: ntorch.EmbeddingBagCollection(e["store"], tables="ab"),
     InvalidRequest, "tables"),
    ("ebc pooling bad", lambda e: ntorch.EmbeddingBagCollection(e["store"], pooling="avg"),
     InvalidRequest, "pooling"),
    ("ebc pooling map bad",
     lambda e: ntorch.EmbeddingBagCollection(e["store"], pooling={"a": "median"}),
     InvalidRequest, "pooling"),
    ("ebc pooling unknown table",
     lambda e: ntorch.EmbeddingBagCollection(e["store"], pooling={"zz": "sum"}),
     UnknownTable, "zz"),
    ("ebc pooling int", lambda e: ntorch.EmbeddingBagCollection(e["store"], pooling=3),
     InvalidRequest, "pooling"),
    ("ebc keyed not a list", lambda e: ntorch.EmbeddingBagCollection(None, keyed=e["keyed"]),
     InvalidRequest, "keyed"),
    ("keyedtensor missing key",
     lambda e: ntorch.EmbeddingBagCollection(e["store"])(_kjt())["missing"],
     UnknownTable, "missing"),
    ("kjt keys a str", lambda e: ntorch.KeyedJaggedTensor("ab", torch.tensor([1, 2]),
                                                          lengths=torch.tensor([1, 1])),
     InvalidRequest, "keys"),
    ("kjt values a list", lambda e: ntorch.KeyedJaggedTensor(["a"], [1, 2],
                                                             lengths=torch.tensor([2])),
     InvalidRequest, "values"),
    ("kjt float lengths", lambda e: ntorch.KeyedJaggedTensor(["a"], torch.tensor([1, 2]),
                                                             lengths=torch.tensor([2.0])),
     InvalidRequest, "lengths"),
    ("kjt bags not per key", lambda e: ntorch.KeyedJaggedTensor(
        ["a", "b"], torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 1])),
     InvalidRequest, "same number"),
    ("kjt weights shape", lambda e: ntorch.KeyedJaggedTensor(
        ["a"], torch.tensor([1, 2]), lengths=torch.tensor([2]), weights=torch.ones(3)),
     InvalidRequest, "weights"),
    ("gpu probability str", lambda e: __import__("nearrec.gpu", fromlist=["x"]).GpuCacheConfig(
        hbm_budget="1MiB", admission_probability="0.5").validate(), InvalidRequest,
     "admission_probability"),
    ("gpu slots float", lambda e: __import__("nearrec.gpu", fromlist=["x"]).GpuCacheConfig(
        slots=100.5).validate(), InvalidRequest, "slots"),
    ("gpu seed negative", lambda e: __import__("nearrec.gpu", fromlist=["x"]).GpuCacheConfig(
        hbm_budget="1MiB", seed=-1).validate(), InvalidRequest, "seed"),
]


@pytest.mark.parametrize(("name", "call", "error", "word"), TORCH_CASES,
                         ids=[c[0] for c in TORCH_CASES])
def test_torch_inputs(env: dict[str, Any], name: str, call: Callable[[Any], Any],
                      error: type[NearrecError], word: str) -> None:
    _raises(lambda: call(env), error, word)


def test_keyedtensor_missing_is_a_keyerror(env: dict[str, Any]) -> None:
    kt = ntorch.EmbeddingBagCollection(env["store"])(_kjt())
    with pytest.raises(KeyError):
        kt["missing"]
    assert kt["a"].shape == (2, 4)


# --- nearrec.datasets -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("datasets")
    out = {"dir": d / "adir", "missing": d / "missing.tsv"}
    out["dir"].mkdir()
    (out.setdefault("bad_gz", d / "bad.tsv.gz")).write_bytes(b"this is not gzip at all")
    (out.setdefault("trunc_gz", d / "trunc.tsv.gz")).write_bytes(
        gzip.compress(b"1\t2\t3\n" * 50)[:20])
    (out.setdefault("binary", d / "binary.tsv")).write_bytes(b"\xff\xfe\x00\x81" * 16 + b"\n")
    (out.setdefault("garbage_pt", d / "garbage.pt")).write_bytes(b"garbage that is no pickle")
    (out.setdefault("empty_pt", d / "empty.pt")).write_bytes(b"")
    torch.save((torch.tensor(1), torch.tensor(2), torch.tensor(3)),
               out.setdefault("zerod_pt", d / "zerod.pt"))
    torch.save((torch.tensor([0, 1]), torch.tensor([0, 1, 2]), torch.tensor([[1, 1]])),
               out.setdefault("good_pt", d / "good.pt"))
    (out.setdefault("bin_ml", d / "u.data")).write_bytes(b"\xff\xfe\x00\x81 1 2 3\n")
    (out.setdefault("good_ml", d / "ml.data")).write_text("1 10 5 100\n2 10 4 101\n1 11 3 102\n")
    (out.setdefault("bad_whl", d / "x.whl")).write_bytes(b"not a zip")
    return out


DATASET_CASES: list[Case] = [
    ("criteo missing", lambda f: datasets.criteo(f["missing"]), StoreNotFound, "does not exist"),
    ("criteo dir", lambda f: datasets.criteo(f["dir"]), StoreIOError, "directory"),
    ("criteo None", lambda f: datasets.criteo(None), InvalidRequest, "path"),
    ("criteo bad gzip", lambda f: datasets.criteo(f["bad_gz"]), InvalidTrace, "gzip"),
    ("criteo truncated gzip", lambda f: datasets.criteo(f["trunc_gz"]), InvalidTrace, "trunc"),
    ("criteo binary", lambda f: datasets.criteo(f["binary"]), InvalidTrace, "text"),
    ("criteo rows str", lambda f: datasets.criteo(f["binary"], rows="abc"),
     InvalidRequest, "rows"),
    ("criteo rows floats", lambda f: datasets.criteo(f["binary"], rows=[1.5] * 26),
     InvalidRequest, "rows"),
    ("criteo batch_size 0", lambda f: datasets.criteo(f["binary"], batch_size=0),
     InvalidRequest, "batch_size"),
    ("criteo chunk 0", lambda f: datasets.criteo(f["binary"], chunk=0),
     InvalidRequest, "chunk"),
    ("criteo samples -1", lambda f: datasets.criteo(f["binary"], samples=-1),
     InvalidRequest, "samples"),
    ("fbgemm missing", lambda f: datasets.fbgemm_file(f["missing"]), StoreNotFound, "exist"),
    ("fbgemm dir", lambda f: datasets.fbgemm_file(f["dir"]), StoreIOError, "directory"),
    ("fbgemm garbage", lambda f: datasets.fbgemm_file(f["garbage_pt"]), InvalidTrace, "triple"),
    ("fbgemm empty", lambda f: datasets.fbgemm_file(f["empty_pt"]), InvalidTrace, "empty"),
    ("fbgemm 0-d tensors", lambda f: datasets.fbgemm_file(f["zerod_pt"]),
     InvalidTrace, "1-D"),
    ("fbgemm rows str", lambda f: datasets.fbgemm_file(f["good_pt"], rows="5"),
     InvalidRequest, "rows"),
    ("fbgemm names str", lambda f: datasets.fbgemm_file(f["good_pt"], names="t"),
     InvalidRequest, "names"),
    ("fbgemm batch_size 0", lambda f: datasets.fbgemm_file(f["good_pt"], batch_size=-2),
     InvalidRequest, "batch_size"),
    ("movielens missing", lambda f: datasets.movielens_100k(f["missing"]),
     StoreNotFound, "exist"),
    ("movielens binary", lambda f: datasets.movielens_100k(f["bin_ml"]), InvalidTrace, "text"),
    ("movielens bad wheel", lambda f: datasets.movielens_100k(f["bad_whl"]),
     InvalidTrace, "zip"),
    ("movielens history -1", lambda f: datasets.movielens_100k(f["good_ml"], history=-1),
     InvalidRequest, "history"),
    ("movielens batch_size 0", lambda f: datasets.movielens_100k(f["good_ml"], batch_size=0),
     InvalidRequest, "batch_size"),
]


@pytest.mark.parametrize(("name", "call", "error", "word"), DATASET_CASES,
                         ids=[c[0] for c in DATASET_CASES])
def test_dataset_inputs(files: dict[str, Path], name: str, call: Callable[[Any], Any],
                        error: type[NearrecError], word: str) -> None:
    _raises(lambda: call(files), error, word)


def test_dataset_good_inputs_still_load(files: dict[str, Path]) -> None:
    t = datasets.fbgemm_file(files["good_pt"])
    assert list(t.tables) == ["t0"]
    assert len(datasets.movielens_100k(files["good_ml"], history=0).tables) == 3


# --- nearrec.simulate -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def sim_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("simulate")
    (garbage := d / "garbage.json").write_bytes(b"{not json\xff")
    (listed := d / "list.json").write_text(json.dumps([1, 2]))
    return {"garbage": garbage, "list": listed, "dir": d, "missing": d / "missing.bin"}


SIM_CASES: list[Case] = [
    ("device None", lambda f: sim.device(None), InvalidRequest, "device"),
    ("device int", lambda f: sim.device(3), InvalidRequest, "device"),
    ("device garbage file", lambda f: sim.device(f["garbage"]), InvalidRequest, "JSON"),
    ("device list file", lambda f: sim.device(f["list"]), InvalidRequest, "object"),
    ("device dir", lambda f: sim.device(f["dir"]), StoreIOError, "read"),
    ("set_field None name", lambda f: sim.set_field(sim.device(), None, 1),
     InvalidRequest, "field"),
    ("set_field None cfg", lambda f: sim.set_field(None, "a", 1), InvalidRequest, "dict"),
    ("read_rate qd -1", lambda f: sim.read_rate("rm-ssd", -1), InvalidRequest, "queue_depth"),
    ("read_rate qd 2**70", lambda f: sim.read_rate("rm-ssd", 2**70),
     InvalidRequest, "queue_depth"),
    ("read_rate nbytes -1", lambda f: sim.read_rate("rm-ssd", 1, -1), InvalidRequest, "nbytes"),
    ("calibrate missing", lambda f: sim.calibrate([f["missing"]], depths=(1,), reads=10,
                                                  repeats=1),
     StoreNotFound, "no file"),
    ("calibrate empty", lambda f: sim.calibrate([]), InvalidRequest, "at least one file"),
    ("calibrate str", lambda f: sim.calibrate(str(f["missing"])), InvalidRequest, "list"),
    ("calibrate depth -1", lambda f: sim.calibrate([f["garbage"]], depths=(-1,)),
     InvalidRequest, "depths"),
    ("workload rows 0", lambda f: sim.workload("rmc1", rows=0), InvalidRequest, "rows"),
    ("workload rows -1", lambda f: sim.workload("rmc1", rows=-1), InvalidRequest, "rows"),
    ("workload dim 0", lambda f: sim.workload("rmc1", dim=0), InvalidRequest, "dim"),
    ("workload tables -2", lambda f: sim.workload("rmc1", tables=-2), InvalidRequest, "tables"),
    ("sweep models a str", lambda f: sim.sweep("rmc1"), InvalidRequest, "models"),
    ("sweep over a list", lambda f: sim.sweep(over=[("batch", [1])]), InvalidRequest, "over"),
    ("sweep over value", lambda f: sim.sweep(over={"batch": 3}), InvalidRequest, "batch"),
    ("generator k str", lambda f: sim.generator("0.3"), InvalidRequest, "k"),
    ("generator stride 0", lambda f: sim.generator(0.3, stride=0), InvalidRequest, "stride"),
    ("run seed -1", lambda f: sim.run(seed=-1), InvalidRequest, "seed"),
]


@pytest.mark.parametrize(("name", "call", "error", "word"), SIM_CASES,
                         ids=[c[0] for c in SIM_CASES])
def test_simulate_inputs(sim_files: dict[str, Path], name: str, call: Callable[[Any], Any],
                         error: type[NearrecError], word: str) -> None:
    _raises(lambda: call(sim_files), error, word)
