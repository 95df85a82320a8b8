"""The node's Open Inference Protocol (`inference.GRPCInferenceService`, on `nearrec serve`'s
port beside `nearrec.v1.Node`), asked by stock clients with no nearrec code on their side —
`tritonclient.grpc` and KServe's `InferenceGRPCClient` — under the node's ACL: the server's and
models' readiness and metadata; a TorchRec DLRM's predictions equal to TorchRec's; each store's
pooled lookups (`STORE.pooled`, and `STORE` for a store without a model) equal to
`nearrec.open`'s; bad requests refused naming their input and sample while the next is served;
calls counted on the node's metrics as the native ones are."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import Node
from dlrm_requests import (
    TORCHREC_INPUTS,
    TORCHREC_ROWS,
    body_for,
    tensors,
    torchrec_answer,
    torchrec_dlrm,
)

import nearrec

grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient is not installed")
from tritonclient.utils import InferenceServerException  # noqa: E402

RANKER, PLAIN = "ranker-secret", "plain-secret"


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Node, dict[str, Any]]]:
    """One node with an ACL serving a TorchRec DLRM's store (`dlrm`) and a store without a model
    (`plain`); the ranker may read both, the other principal `plain` only."""
    tmp = tmp_path_factory.mktemp("oip")
    theirs, _ = torchrec_dlrm(tmp / "dlrm")
    rng = np.random.default_rng(3)
    nearrec.from_numpy(tmp / "plain", {"a": rng.standard_normal((50, 4), dtype=np.float32),
                                       "b": rng.standard_normal((30, 8), dtype=np.float32)})

    def h(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    acl = tmp / "acl.toml"
    acl.write_text(f'[principal.ranker]\ntoken_sha256 = "{h(RANKER)}"\nread = ["*"]\n\n'
                   f'[principal.plain]\ntoken_sha256 = "{h(PLAIN)}"\nread = ["plain/*"]\n')
    served = Node(f"{tmp / 'dlrm'}=dlrm", f"{tmp / 'plain'}=plain", "--acl", str(acl))
    try:
        yield served, {"dlrm": theirs, "paths": {"dlrm": tmp / "dlrm", "plain": tmp / "plain"}}
    finally:
        served.stop()


def _pooled(path: Path, body: dict[str, Any]) -> np.ndarray:
    with nearrec.open(path) as local:
        return local.lookup_many([nearrec.TableLookup(t, f["ids"], lengths=f["lengths"])
                                  for t, f in body["features"].items()]).values


def _table_body(path: Path, rng: np.random.Generator, batch: int) -> dict[str, Any]:
    with nearrec.open(path) as s:
        tables = list(s.tables)
        rows = [s.table(t).rows for t in tables]
    return body_for(rng, tables, rows, 0, batch)


def test_tritonclient_reads_the_node_and_its_models(node):
    served, _ = node
    client = grpcclient.InferenceServerClient(served.address)
    ranker = _bearer(RANKER)
    assert client.is_server_live(headers=ranker) and client.is_server_ready(headers=ranker)
    meta = client.get_server_metadata(headers=ranker, as_json=True)
    assert meta["name"] == "nearrec" and meta["version"] == nearrec.__version__
    assert client.is_model_ready("dlrm", headers=ranker)
    assert client.is_model_ready("plain.pooled", headers=ranker)
    model = client.get_model_metadata("dlrm", headers=ranker, as_json=True)
    shapes = {i["name"]: (i["datatype"], i["shape"]) for i in model["inputs"]}
    assert shapes == {"dense": ("FP32", ["-1", "5"]),
                      **{f: ("INT64", ["-1", "-1"]) for f in TORCHREC_INPUTS},
                      **{f"{f}__lengths": ("INT64", ["-1", "1"]) for f in TORCHREC_INPUTS}}
    assert [(o["name"], o["shape"]) for o in model["outputs"]] == [("predictions", ["-1", "1"])]
    assert model["versions"] == ["1"] and model["platform"] == "nearrec"
    pooled = client.get_model_metadata("plain.pooled", headers=ranker, as_json=True)
    assert [i["name"] for i in pooled["inputs"]] == ["a", "a__lengths", "b", "b__lengths"]
    assert [(o["name"], o["shape"]) for o in pooled["outputs"]] == [("pooled", ["-1", "12"])]


def test_predictions_and_pooled_lookups_equal_the_models_own(node):
    served, models = node
    client = grpcclient.InferenceServerClient(served.address)
    ranker = _bearer(RANKER)
    rng = np.random.default_rng(4)
    for batch in (1, 6, 64):
        body = body_for(rng, TORCHREC_INPUTS, TORCHREC_ROWS, 5, batch)
        got = client.infer("dlrm", tensors(grpcclient, body), headers=ranker)
        np.testing.assert_allclose(got.as_numpy("predictions"),
                                   torchrec_answer(models["dlrm"], body), rtol=1e-4, atol=1e-5)
        assert got.get_response().model_version == "1"
    for name, store in (("dlrm.pooled", "dlrm"), ("plain", "plain"), ("plain.pooled", "plain")):
        body = _table_body(models["paths"][store], rng, 5)
        got = client.infer(name, tensors(grpcclient, body), headers=ranker,
                           outputs=[grpcclient.InferRequestedOutput("pooled")])
        np.testing.assert_allclose(got.as_numpy("pooled"), _pooled(models["paths"][store], body),
                                   rtol=1e-6, atol=1e-6)


def test_the_acl_holds_for_the_protocol(node):
    served, _ = node
    client = grpcclient.InferenceServerClient(served.address)
    body = body_for(np.random.default_rng(5), TORCHREC_INPUTS, TORCHREC_ROWS, 5, 2)
    with pytest.raises(InferenceServerException, match="token") as e:
        client.infer("dlrm", tensors(grpcclient, body))
    assert e.value.status() == "StatusCode.UNAUTHENTICATED"
    with pytest.raises(InferenceServerException) as e:
        client.is_server_live(headers=_bearer("a guess"))
    assert e.value.status() == "StatusCode.UNAUTHENTICATED"
    # a store the principal holds no grant on is one the node does not serve, to it
    with pytest.raises(InferenceServerException, match="plain") as e:
        client.infer("dlrm", tensors(grpcclient, body), headers=_bearer(PLAIN))
    assert e.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("dlrm", headers=_bearer(PLAIN))
    assert e.value.status() == "StatusCode.NOT_FOUND"
    assert client.is_server_ready(headers=_bearer(PLAIN))


def test_bad_requests_are_named_and_the_next_is_served(node):
    served, models = node
    client = grpcclient.InferenceServerClient(served.address)
    ranker = _bearer(RANKER)
    rng = np.random.default_rng(6)
    body = body_for(rng, TORCHREC_INPUTS, TORCHREC_ROWS, 5, 3)
    past = {**body, "features": {**body["features"],
                                 "f1": {"ids": [10_000], "lengths": [1, 0, 0]}}}
    with pytest.raises(InferenceServerException, match="10000") as e:
        client.infer("dlrm", tensors(grpcclient, past), headers=ranker)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    ins = tensors(grpcclient, body)
    for t in ins:
        if t.name() == "f2__lengths":
            t.set_data_from_numpy(np.full((3, 1), 99, np.int64))
    with pytest.raises(InferenceServerException, match="f2__lengths.*sample 0 has length 99"):
        client.infer("dlrm", ins, headers=ranker)
    with pytest.raises(InferenceServerException, match="f0__lengths"):
        client.infer("dlrm", [t for t in tensors(grpcclient, body) if t.name() != "f0__lengths"],
                     headers=ranker)
    with pytest.raises(InferenceServerException, match="version 1 only"):
        client.infer("dlrm", tensors(grpcclient, body), model_version="2", headers=ranker)
    with pytest.raises(InferenceServerException, match="its output is \"predictions\""):
        client.infer("dlrm", tensors(grpcclient, body), headers=ranker,
                     outputs=[grpcclient.InferRequestedOutput("pooled")])
    # pooled lookups take no dense features, and need an input
    plain = _table_body(models["paths"]["plain"], rng, 2)
    with pytest.raises(InferenceServerException, match="dense"):
        client.infer("plain.pooled", tensors(grpcclient, {**plain, "dense": [[1.0], [2.0]]}),
                     headers=ranker)
    with pytest.raises(InferenceServerException) as e:
        client.infer("plain.pooled", [], headers=ranker)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    got = client.infer("dlrm", tensors(grpcclient, body), headers=ranker)
    np.testing.assert_allclose(got.as_numpy("predictions"), torchrec_answer(models["dlrm"], body),
                               rtol=1e-4, atol=1e-5)
    # counted as the native calls are, by call and status
    calls = {(s[0]["call"], s[0]["code"]): s[1]
             for s in served.metrics()["nearrec_requests"] if "call" in s[0]}
    assert calls[("ModelInfer", "Ok")] >= 1 and calls[("ModelInfer", "InvalidArgument")] >= 6


#: KServe's client, in a process of its own: its protobuf module and tritonclient's both register
#: the `inference` package, and one process holds only one of them.
KSERVE_CLIENT = """
import asyncio, json, sys
import numpy as np
import kserve
sys.path.insert(0, sys.argv[4])
from dlrm_requests import tensors

address, token, body = sys.argv[1], sys.argv[2], json.loads(open(sys.argv[3]).read())
headers = [("authorization", f"Bearer {token}")]

async def ask():
    client = kserve.InferenceGRPCClient(address, timeout=30)
    try:
        ready = await client.is_model_ready("dlrm", headers=headers)
        inputs = tensors(kserve, body)
        raw = await client.infer(kserve.InferRequest("dlrm", inputs), headers=headers)
        # the values in the message's typed contents this time, not as raw bytes
        for t in inputs:
            t.set_data_from_numpy(t.as_numpy(), binary_data=False)
        typed = await client.infer(kserve.InferRequest("dlrm", inputs), headers=headers)
        return ready, raw.outputs[0].as_numpy(), typed.outputs[0].as_numpy()
    finally:
        await client.close()

ready, raw, typed = asyncio.run(ask())
print(json.dumps({"ready": ready, "raw": raw.tolist(), "typed": typed.tolist()}))
"""


def test_kserves_client_infers_over_the_protocol(node, tmp_path):
    import importlib.util
    import json
    import subprocess
    import sys

    if importlib.util.find_spec("kserve") is None:
        pytest.skip("KServe's SDK is not installed")
    served, models = node
    body = body_for(np.random.default_rng(7), TORCHREC_INPUTS, TORCHREC_ROWS, 5, 4)
    (tmp_path / "body.json").write_text(json.dumps(body))
    r = subprocess.run([sys.executable, "-c", KSERVE_CLIENT, served.address, RANKER,
                        str(tmp_path / "body.json"), str(Path(__file__).parent)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.splitlines()[-1])
    want = torchrec_answer(models["dlrm"], body)
    assert got["ready"]
    np.testing.assert_allclose(np.asarray(got["raw"]), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got["typed"]), want, rtol=1e-4, atol=1e-5)
