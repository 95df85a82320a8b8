"""The README's quick start, run in CI: build a store from numpy, pool bags like
torch.nn.EmbeddingBag, and use it as the sparse part of a model."""

import tempfile
from pathlib import Path

import numpy as np

import nearrec

with tempfile.TemporaryDirectory() as tmp:
    rng = np.random.default_rng(0)
    users = rng.standard_normal((10_000, 32), dtype=np.float32)
    items = rng.standard_normal((50_000, 16), dtype=np.float32)
    nearrec.from_numpy(Path(tmp) / "store", {"users": users, "items": items},
                       dtype={"items": "int8"})

    store = nearrec.open(Path(tmp) / "store")
    print(store, {n: (t.rows, t.dim, t.dtype) for n, t in store.tables.items()})

    # Two bags: users[1] + users[2], and users[3] (EmbeddingBag's indices + offsets).
    pooled = store.lookup("users", np.array([1, 2, 3]), offsets=np.array([0, 2]))
    assert np.allclose(pooled[0], users[1] + users[2]) and np.allclose(pooled[1], users[3])

    # Several tables in one call: one bag per sample per table -> [batch, 32 + 16].
    batch = store.lookup_many({
        "users": (np.array([5, 6, 7, 8]), np.array([0, 1, 3])),
        "items": (np.array([10, 20, 30]), np.array([0, 0, 2])),
    })
    print("pooled", batch.values.shape, "items view", batch["items"].shape)

    # The same store served from SSD: nothing loaded, each batch reads only the blocks holding
    # its rows (direct I/O), pooled as they land. Same answers; the reads are accounted.
    ssd = nearrec.open(Path(tmp) / "store", tier="ssd")
    assert np.allclose(ssd.lookup("users", np.array([1, 2, 3]), offsets=np.array([0, 2])), pooled)
    pending = ssd.submit({"users": (np.array([5, 6]), np.array([0, 1]))})  # collect later
    print("ssd", pending.result().values.shape, {k: ssd.stats()[k] for k in
                                                  ("device", "device_reads", "bytes_read")})

    # A trace, a plan for a small DRAM budget from it, and the store served behind that plan:
    # pinned hot rows and row caches in front of the SSD tier, same answers.
    import nearrec.plan as nplan
    import nearrec.trace as nt

    trace = nt.generate(store, bags=2_000, pooling=20, generator=nt.Generator.zipf(1.05))
    plan = nplan.make_plan(store.info, trace, budget="256KiB")
    cached = nearrec.open(Path(tmp) / "store", tier="ssd", dram_budget="256KiB", plan=plan)
    for requests in trace.batches(64):
        assert np.allclose(cached.lookup_many(requests).values,
                           store.lookup_many(requests).values, atol=1e-5)
    print(plan.text().splitlines()[0], "| served from DRAM:",
          f"{100 * cached.stats()['dram_hit_ratio']:.0f} %")

    try:
        import torch

        import nearrec.torch as ntorch

        bag = ntorch.EmbeddingBag(store, "users", mode="mean")
        out = bag(torch.tensor([[1, 2], [3, 4]]))
        print("nearrec.torch.EmbeddingBag ->", tuple(out.shape))
    except ImportError:
        print("torch not installed; skipping the nearrec.torch part")

    try:
        import torch
        import torchrec
        from torchrec.models.dlrm import DLRM

        import nearrec.torch as ntorch

        # A TorchRec model (here untrained), served from SSD as it is: its tables written to a
        # store, its collections nearrec's, the same outputs.
        tables = [torchrec.EmbeddingBagConfig(name=f"t{i}", embedding_dim=8, num_embeddings=1000,
                                              feature_names=[f"f{i}"]) for i in range(3)]
        model = DLRM(embedding_bag_collection=torchrec.EmbeddingBagCollection(tables=tables),
                     dense_in_features=4, dense_arch_layer_sizes=[8], over_arch_layer_sizes=[8, 1])
        served = ntorch.from_torchrec(model, Path(tmp) / "dlrm", tier="ssd",
                                      dram_budget="16KiB")
        features = torchrec.KeyedJaggedTensor.from_lengths_sync(
            keys=["f0", "f1", "f2"], values=torch.arange(9) * 97 % 1000,
            lengths=torch.tensor([2, 1, 1, 2, 0, 3]))
        dense = torch.randn(2, 4)
        with torch.inference_mode():
            assert torch.allclose(served(dense, features), model(dense, features), atol=1e-6)
        print("TorchRec DLRM served from SSD ->", tuple(served(dense, features).shape))
    except ImportError:
        print("torchrec not installed; skipping the TorchRec part")
