"""What a `nearrec.ray.serve_model` replica does with requests, without Ray: each request
checked alone (a bad one named, table and all), checked requests run as one batch and each
answered with its own rows — held to the model run on each request by itself — a request the
store refuses answered alone while the others in its batch are answered, and the whole model
run on the store (offload) answering the same; and every model nearrec keeps (its families, a
TorchRec DLRM quantised or not) served over the embedded store and a sharded one, equal to the
model itself. Ray Serve around it: `tests/test_ray.py`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import Node
from dlrm_requests import answer, body_for, request, torchrec_answer

import nearrec
import nearrec.models
from nearrec import InvalidRequest, distributed
from nearrec._serve import Request, Runner

ROWS = 300


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("serve") / "dlrm"
    nearrec.build(path, "rmc1", rows=ROWS, seed=0, progress=False)
    store = nearrec.open(path)
    model = nearrec.models.build("rmc1", store, seed=3).eval()
    nearrec.models.save(model, path)
    return nearrec.open(path), model


def test_requests_in_one_batch_each_get_their_own_rows(served):
    store, model = served
    rng = np.random.default_rng(0)
    runner = Runner(store, model.kept_config(), dict(model.dense_weights()),
                    model.dense_features, offload=False)
    bodies = [request(rng, model, ROWS, b) for b in (1, 3, 5, 2)]
    items = [Request.from_json(b, runner.inputs, runner.dense_features) for b in bodies]
    outs = runner.run(items)
    assert runner.batches == 1 and runner.requests == 4
    for b, out in zip(bodies, outs, strict=True):
        np.testing.assert_allclose(out, answer(model, b), rtol=1e-5, atol=1e-6)
    # the whole model on the store answers the same
    offloaded = Runner(store, model.kept_config(), {}, model.dense_features, offload=True)
    for b, out in zip(bodies, offloaded.run(items), strict=True):
        np.testing.assert_allclose(out, answer(model, b), rtol=1e-4, atol=1e-5)


def test_a_request_the_store_refuses_is_answered_alone(served):
    store, model = served
    rng = np.random.default_rng(1)
    runner = Runner(store, model.kept_config(), dict(model.dense_weights()),
                    model.dense_features, offload=False)
    good, bad = request(rng, model, ROWS, 2), request(rng, model, ROWS, 2)
    first = model.table_names[0]
    bad["features"][first] = {"ids": [ROWS + 1], "lengths": [1, 0]}
    items = [Request.from_json(b, runner.inputs, runner.dense_features) for b in (good, bad)]
    outs = runner.run(items)
    np.testing.assert_allclose(outs[0], answer(model, good), rtol=1e-5, atol=1e-6)
    assert isinstance(outs[1], nearrec.IndexOutOfRange) and outs[1].table == first


def test_a_bad_request_is_named_before_it_is_batched(served):
    _, model = served
    tables, dense = model.table_names, model.dense_features
    rng = np.random.default_rng(2)
    ok = request(rng, model, ROWS, 2)
    cases = {
        "no features": ({"dense": ok["dense"]}, None),
        "an unknown table": ({**ok, "features": {**ok["features"], "nope": {"ids": [],
                                                                          "lengths": [0, 0]}}},
                             "nope"),
        "a missing table": ({**ok, "features": {t: f for t, f in ok["features"].items()
                                                if t != tables[1]}}, tables[1]),
        "lengths that do not add up": ({**ok, "features": {**ok["features"], tables[0]: {
            "ids": [1, 2, 3], "lengths": [1, 1]}}}, tables[0]),
        "ids that are not integers": ({**ok, "features": {**ok["features"], tables[0]: {
            "ids": ["x"], "lengths": [1, 0]}}}, tables[0]),
        "dense of another width": ({**ok, "dense": [[0.0] * (dense + 1)] * 2}, None),
    }
    for what, (b, table) in cases.items():
        with pytest.raises(InvalidRequest) as e:
            Request.from_json(b, tables, dense)
        assert e.value.table == table, what


# Every kept model on every front end (issue 64): nearrec's families, a TorchRec DLRM after
# from_torchrec and its quantised forms, each served by a replica's runner — its dense part
# there, or the model kept with the store through Store.infer — over the embedded store and
# over a sharded store whose tables span two loopback nodes, held to the model itself.

def _torchrec_models(tmp_path: Path) -> dict[str, tuple[Any, Any, Path]]:
    """name: (the TorchRec model, the model over its nearrec store, the store's path)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchrec")
    from test_quantized import quantized_dlrm
    from test_torchrec import dlrm

    from nearrec.torch import from_torchrec

    out = {}
    torch.manual_seed(5)
    for name, model in (("torchrec", dlrm().eval()), ("torchrec-int8", quantized_dlrm()),
                        ("torchrec-int4", quantized_dlrm(dtype=torch.quint4x2))):
        path = tmp_path / name
        ours = from_torchrec(model, path)
        nearrec.models.save(ours, path)  # kept, for Store.infer
        out[name] = (model, ours, path)
    return out


def _sharded(path: Path, root: Path) -> tuple[nearrec.Store, list[Node]]:
    """The store at `path` cut by table into two shards, each served by a loopback node."""
    plan = distributed.shard(path, root, 2, scheme="table")
    nodes = [Node(f"{root / f'shard-{k}'}=s") for k in range(plan.shards)]
    return distributed.connect(root, [[f"{n.address}/s"] for n in nodes]), nodes


@pytest.mark.parametrize("front", ["embedded", "sharded"])
def test_every_kept_model_is_served_equal_to_itself(served, tmp_path, front):
    from nearrec.models import kept

    store, family = served
    cases: dict[str, tuple[Any, Any, Path, Any]] = {
        "rmc1": (family, family, Path(store.info.path), lambda b: answer(family, b))}
    for name, (theirs, ours, path) in _torchrec_models(tmp_path).items():
        cases[name] = (ours, theirs, path, lambda b, m=theirs: torchrec_answer(m, b))
    rng = np.random.default_rng(7)
    for name, (model, _, path, want) in cases.items():
        config, weights, dense = kept(model)
        nodes: list[Node] = []
        over = nearrec.open(path)
        if front == "sharded":
            over, nodes = _sharded(path, tmp_path / f"cut-{name}")
            if name != "rmc1":  # a captured model's tables span the two shards
                assert len({p.shard for t in distributed.load_plan(
                    tmp_path / f"cut-{name}").tables for p in t.parts}) == 2
        try:
            # the model as the store keeps it, read through it (a sharded store: from a shard)
            _, loaded, _ = kept(nearrec.models.load(over))
            assert loaded.keys() == weights.keys(), name
            for k, w in weights.items():
                np.testing.assert_array_equal(loaded[k], w, err_msg=f"{name} {k}")
            # the dense part in the replica, and the model kept with the store (Store.infer: on
            # the sharded store, run by the router over the vectors it pools)
            for offload in (False, True):
                runner = Runner(over, config, weights, dense, offload=offload)
                tables = config.get("tables") or runner.inputs
                bodies = [body_for(rng, runner.inputs, [over.table(t).rows for t in tables],
                                   dense, b) for b in (1, 4, 9)]
                items = [Request.from_json(b, runner.inputs, dense) for b in bodies]
                for b, out in zip(bodies, runner.run(items), strict=True):
                    np.testing.assert_allclose(out, want(b), rtol=1e-4, atol=1e-5,
                                               err_msg=f"{name} offload={offload}")
        finally:
            over.close()
            for n in nodes:
                n.stop()
