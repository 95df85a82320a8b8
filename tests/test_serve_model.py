"""What a `nearrec.ray.serve_model` replica does with requests, without Ray: each request
checked alone (a bad one named, table and all), checked requests run as one batch and each
answered with its own rows — held to the model run on each request by itself — a request the
store refuses answered alone while the others in its batch are answered, and the whole model
run on the store (offload) answering the same. Ray Serve around it: `tests/test_ray.py`."""

from __future__ import annotations

import numpy as np
import pytest
from dlrm_requests import answer, request

import nearrec
import nearrec.models
from nearrec import InvalidRequest
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
    items = [Request.from_json(b, runner.tables, runner.dense_features) for b in bodies]
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
    items = [Request.from_json(b, runner.tables, runner.dense_features) for b in (good, bad)]
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
