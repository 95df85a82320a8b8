"""A store on the real Triton Inference Server (`nearrec triton export`, `nearrec.triton`): the
`tritonserver` binary of the nvidia-pytriton wheel (`make test` unpacks it under
`.venv/triton`) started on loopback ports on an exported repository, asked through
`tritonclient.grpc` and `tritonclient.http`: readiness and metadata; a TorchRec DLRM's
predictions, quantised and not, equal to TorchRec's; concurrent requests batched and each
answered exactly; a bad request answered as an error naming its input while the next is
served; a store without a model as pooled lookups, equal to `nearrec.open`'s; a store served
through a node, and a sharded store whose tables span its shards."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
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
import nearrec.distributed
from nearrec.triton import export
from nearrec_bench.served import TRITON, Triton, tritonserver

grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient is not installed")
httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient is not installed")
if not (TRITON / "pytriton" / "tritonserver" / "bin" / "tritonserver").exists():
    pytest.skip(f"no tritonserver under {TRITON} (make's environment unpacks it)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Triton, dict[str, Any]]]:
    """A repository of three models — a TorchRec DLRM, its int8-quantised form, and a store
    without a model — served by one `tritonserver`."""
    import torch
    from test_quantized import quantized_dlrm

    from nearrec.torch import from_torchrec

    tmp = tmp_path_factory.mktemp("triton")
    repo = tmp / "repo"
    theirs, _ = torchrec_dlrm(tmp / "dlrm")
    torch.manual_seed(7)
    quantized = quantized_dlrm()
    import nearrec.models

    nearrec.models.save(from_torchrec(quantized, tmp / "int8"), tmp / "int8")
    rng = np.random.default_rng(3)
    nearrec.from_numpy(tmp / "plain", {"a": rng.standard_normal((50, 4), dtype=np.float32),
                                       "b": rng.standard_normal((30, 8), dtype=np.float32)})
    numpy1 = [TRITON / "numpy1"]
    for name in ("dlrm", "int8", "plain"):
        export(tmp / name, repo, name=name, python_path=numpy1, queue_delay_us=20000)
    with tritonserver(repo, tmp) as server:
        yield server, {"dlrm": theirs, "int8": quantized, "plain": tmp / "plain"}


def _client(server: Triton) -> Any:
    return grpcclient.InferenceServerClient(server.grpc)


def test_the_server_is_ready_and_describes_the_models(served):
    server, _ = served
    assert _client(server).is_model_ready("dlrm")
    meta = _client(server).get_model_metadata("dlrm", as_json=True)
    names = {i["name"]: i["datatype"] for i in meta["inputs"]}
    assert names == {"dense": "FP32", **{f: "INT64" for f in TORCHREC_INPUTS},
                     **{f"{f}__lengths": "INT64" for f in TORCHREC_INPUTS}}
    assert [o["name"] for o in meta["outputs"]] == ["predictions"]


@pytest.mark.parametrize("model", ["dlrm", "int8"])
def test_predictions_equal_torchrecs_over_grpc_and_http(served, model):
    server, models = served
    http = httpclient.InferenceServerClient(server.http)
    rng = np.random.default_rng(4)
    for batch in (1, 6):
        body = body_for(rng, TORCHREC_INPUTS, TORCHREC_ROWS, 5, batch)
        want = torchrec_answer(models[model], body)
        got = _client(server).infer(model, tensors(grpcclient, body)).as_numpy("predictions")
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        got = http.infer(model, tensors(httpclient, body)).as_numpy("predictions")
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_concurrent_requests_are_batched_and_each_answered_exactly(served):
    server, models = served
    rng = np.random.default_rng(5)
    bodies = [body_for(rng, TORCHREC_INPUTS, TORCHREC_ROWS, 5, int(rng.integers(1, 5)))
              for _ in range(12)]
    got: list[Any] = [None] * len(bodies)

    def send(k: int) -> None:
        client = grpcclient.InferenceServerClient(server.grpc)
        got[k] = client.infer("dlrm", tensors(grpcclient, bodies[k])).as_numpy("predictions")

    threads = [threading.Thread(target=send, args=(k,)) for k in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for body, out in zip(bodies, got, strict=True):
        np.testing.assert_allclose(out, torchrec_answer(models["dlrm"], body), rtol=1e-4,
                                   atol=1e-5)
    stats = _client(server).get_inference_statistics("dlrm", as_json=True)
    s = stats["model_stats"][0]
    assert int(s["execution_count"]) < int(s["inference_count"]), s  # batched


def test_a_bad_request_is_an_error_naming_its_input_and_the_next_is_served(served):
    server, models = served
    rng = np.random.default_rng(6)
    body = body_for(rng, TORCHREC_INPUTS, TORCHREC_ROWS, 5, 3)
    past = {**body, "features": {**body["features"], "f1": {"ids": [10_000],
                                                              "lengths": [1, 0, 0]}}}
    with pytest.raises(Exception, match="t1") as e:
        _client(server).infer("dlrm", tensors(grpcclient, past))
    assert "InferenceServerException" in type(e.value).__name__
    # a length past its row of ids
    ins = tensors(grpcclient, body)
    for t in ins:
        if t.name() == "f2__lengths":
            t.set_data_from_numpy(np.full((3, 1), 99, np.int64))
    with pytest.raises(Exception, match="f2__lengths: sample 0"):
        _client(server).infer("dlrm", ins)
    got = _client(server).infer("dlrm", tensors(grpcclient, body)).as_numpy("predictions")
    np.testing.assert_allclose(got, torchrec_answer(models["dlrm"], body), rtol=1e-4, atol=1e-5)


def test_a_store_without_a_model_answers_its_pooled_lookups(served):
    server, models = served
    local = nearrec.open(models["plain"])
    rng = np.random.default_rng(7)
    body = body_for(rng, ["a", "b"], [50, 30], 0, 5)
    got = _client(server).infer("plain", tensors(grpcclient, body)).as_numpy("pooled")
    want = local.lookup_many([nearrec.TableLookup(t, f["ids"], lengths=f["lengths"])
                              for t, f in body["features"].items()]).values
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _exported_and_served(tmp_path: Any, theirs: Any, store: str, *how: str) -> None:
    """`store` exported by the command line as the model `m` (`how`: its flags), served by
    `tritonserver`, answering as TorchRec's `theirs` does."""
    r = subprocess.run([sys.executable, "-m", "nearrec.cli", "triton", "export", store,
                        str(tmp_path / "repo"), "--name", "m", *how,
                        "--python-path", str(TRITON / "numpy1")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "wrote" in r.stdout, r.stderr
    with tritonserver(tmp_path / "repo", tmp_path) as server:
        body = body_for(np.random.default_rng(8), TORCHREC_INPUTS, TORCHREC_ROWS, 5, 4)
        got = _client(server).infer("m", tensors(grpcclient, body))
        np.testing.assert_allclose(got.as_numpy("predictions"), torchrec_answer(theirs, body),
                                   rtol=1e-4, atol=1e-5)


def test_a_store_served_through_a_node(tmp_path):
    theirs, _ = torchrec_dlrm(tmp_path / "dlrm")
    node = Node(f"{tmp_path / 'dlrm'}=dlrm")
    try:
        _exported_and_served(tmp_path, theirs, "dlrm", "--remote", node.address)
    finally:
        node.stop()


def test_a_sharded_store_whose_tables_span_its_shards(tmp_path):
    from test_distributed import Served, name_replicas

    theirs, _ = torchrec_dlrm(tmp_path / "dlrm")
    root = tmp_path / "s"
    plan = nearrec.distributed.shard(tmp_path / "dlrm", root, 2, scheme="table")
    served = Served(root, plan)
    try:
        name_replicas(root, served.replicas(), 'timeout = 5.0\nhedge = "off"')
        _exported_and_served(tmp_path, theirs, str(root), "--sharded")
    finally:
        served.stop()


def test_what_cannot_be_exported_is_refused_by_name(tmp_path):
    rng = np.random.default_rng(1)
    nearrec.from_numpy(tmp_path / "s", {"a": rng.standard_normal((5, 4), dtype=np.float32)})
    for name in ("", "a/b", 'x"y'):
        with pytest.raises(nearrec.InvalidRequest, match="name"):
            export(tmp_path / "s", tmp_path / "repo", name=name)
    with pytest.raises(nearrec.InvalidRequest, match="max_batch_size"):
        export(tmp_path / "s", tmp_path / "repo", max_batch_size=0)
    with pytest.raises(nearrec.StoreNotFound):
        export(tmp_path / "nowhere", tmp_path / "repo")
    with pytest.raises(nearrec.InvalidRequest, match="not both"):
        export(tmp_path / "s", tmp_path / "repo", remote="127.0.0.1:1", sharded=True)
    assert not (tmp_path / "repo").exists()  # nothing written for a refused export
