"""Checks shared by the GPU-tier tests: the same functions run on the CPU reference, on the
Triton kernels under the interpreter (``tests/gpu_interp_cases.py``, in a subprocess with
``TRITON_INTERPRET=1``) and on CUDA (``@pytest.mark.gpu``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

import nearrec
from nearrec.gpu import GpuCacheConfig, GpuEmbeddingCache, GpuTier
from nearrec.gpu.config import admit

#: (name, rows, dim): a power-of-two width, an odd width, a wide one
TABLES = [("a", 300, 16), ("b", 257, 7), ("c", 120, 40)]
#: tables of one width: the tier probes them in one grouped launch over one shared state
SAME_WIDTH = [("x", 300, 12), ("y", 170, 12), ("z", 257, 12)]


def make_store(root: Path, seed: int = 0, tables: list[tuple[str, int, int]] | None = None
               ) -> tuple[nearrec.Store, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    arrays = {n: rng.standard_normal((r, d), dtype=np.float32)
              for n, r, d in (tables or TABLES)}
    nearrec.from_numpy(root / "store", arrays)
    return nearrec.open(root / "store"), arrays


def random_bags(rng: np.random.Generator, rows: int, bags: int, skew: bool = True
                ) -> tuple[np.ndarray, np.ndarray]:
    """Bags of 0..12 lookups (empty bags included), Zipf-skewed so keys repeat."""
    lengths = rng.integers(0, 13, bags)
    lengths[rng.integers(0, bags)] = 0
    n = int(lengths.sum())
    idx = (rng.zipf(1.3, n) - 1) % rows if skew else rng.integers(0, rows, n)
    return idx.astype(np.int64), np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)


def check_tier_matches_embedding_bag(store: nearrec.Store, arrays: dict[str, np.ndarray],
                                     device: str, backend: str, policy: str, transfer: str,
                                     near: str, seed: int = 0, batches: int = 4) -> GpuTier:
    """Every batch pooled by the tier equals ``nn.EmbeddingBag`` (sum, weighted sum, mean)
    while the caches fill and evict."""
    rng = np.random.default_rng(seed)
    cfg = GpuCacheConfig(slots=64, group_size=8, groups_per_set=2, policy=policy,
                         transfer=transfer, near_data_pooling=near, seed=seed)  # type: ignore
    tier = GpuTier(store, None, cfg, device=device, backend=backend)  # type: ignore[arg-type]
    bags = {n: torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(a), mode="sum")
            for n, a in arrays.items()}
    means = {n: torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(a), mode="mean")
             for n, a in arrays.items()}
    for step in range(batches):
        reqs = []
        want = []
        for name, a in arrays.items():
            idx, off = random_bags(rng, a.shape[0], 9)
            if step % 3 == 0:
                w = rng.random(idx.size, dtype=np.float32)
                reqs.append((name, idx, off, w, "sum"))
                want.append(bags[name](torch.from_numpy(idx), torch.from_numpy(off),
                                       torch.from_numpy(w)))
            elif step % 3 == 1:
                reqs.append((name, torch.from_numpy(idx), torch.from_numpy(off), None, "mean"))
                want.append(means[name](torch.from_numpy(idx), torch.from_numpy(off)))
            else:
                reqs.append((name, idx, off, None, "sum"))
                want.append(bags[name](torch.from_numpy(idx), torch.from_numpy(off)))
        if step % 2:
            got = tier.pool_many(reqs)
        else:
            got = [tier.pool(*r) for r in reqs]
        for (name, *_), g, w_ in zip(reqs, got, want, strict=True):
            assert g.device.type == torch.device(device).type
            torch.testing.assert_close(g.cpu(), w_.detach(), rtol=1e-5, atol=1e-5,
                                       msg=f"table {name} batch {step}")
    for name, s in tier.stats().items():
        assert s.hits + s.misses > 0 and s.admissions <= s.unique_misses, (name, s)
        assert s.evictions <= s.admissions
        cache = tier.tables[name].cache
        keys = cache.cached_keys()
        assert len(set(keys.tolist())) == keys.size, "a key is cached twice"
        # every cached row is the table's row
        state = cache.state
        slots = np.flatnonzero(state.keys.cpu().numpy() >= 0)
        np.testing.assert_array_equal(state.rows.cpu().numpy()[slots],
                                      arrays[name][state.keys.cpu().numpy()[slots]])
    return tier


def check_kernels_match_reference(device: str, frequency_policy: str, seed: int = 0,
                                  tags: bool = True) -> None:
    """The Triton kernels and the reference leave the same cache state and give the same
    pooled sums, flags and looked-up rows, batch after batch."""
    rng = np.random.default_rng(seed)
    rows, dim = 400, 24
    table = torch.from_numpy(rng.standard_normal((rows, dim), dtype=np.float32))
    cfg = GpuCacheConfig(slots=96, group_size=8, groups_per_set=2, policy=frequency_policy,
                         probe_tags=tags)
    kern = GpuEmbeddingCache("t", rows, dim, cfg, device=device, backend="triton")
    ref = GpuEmbeddingCache("t", rows, dim, cfg, device="cpu", backend="reference")
    for step in range(5):
        idx, off = random_bags(rng, rows, 11)
        idx[::17] = rows + 3  # out of range: flagged 2, never pooled
        off_full = np.append(off, idx.size)
        w = rng.random(idx.size, dtype=np.float32) if step % 2 else None
        outs = []
        for c in (kern, ref):
            dev = c.device
            tick = c.next_tick()
            out, flags = c.pool_hits(torch.from_numpy(idx).to(dev),
                                     torch.from_numpy(off_full).to(dev),
                                     None if w is None else torch.from_numpy(w).to(dev), tick)
            outs.append((out.cpu(), flags.cpu()))
            miss = torch.nonzero(flags.cpu()).flatten().numpy()
            keys = np.unique(idx[miss])
            keys = torch.from_numpy(keys[keys < rows]).to(dev)
            taken = admit(keys, c.policy, 0.5, tick, seed)
            ks, sets, src_row = c.plan_replace(keys, taken)
            c.replace(ks, sets, table[keys.cpu()].to(dev), src_row, tick)
        torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-5, atol=1e-5)
        assert torch.equal(outs[0][1], outs[1][1]), f"flags differ at batch {step}"
        for field in ("keys", "tags", "counters", "rows", "stats", "locks"):
            a, b = getattr(kern.state, field).cpu(), getattr(ref.state, field)
            assert torch.equal(a, b), f"{field} differ after batch {step}"
        assert int(kern.state.locks.remainder(2).sum()) == 0, "a set lock was left held"
        probe = torch.from_numpy(rng.integers(0, rows + 5, 50))
        got_k = kern.lookup(probe)
        got_r = ref.lookup(probe)
        torch.testing.assert_close(got_k[0].cpu(), got_r[0])
        assert torch.equal(got_k[1].cpu(), got_r[1])
        hit = np.setdiff1d(np.arange(50), got_r[1].numpy())
        torch.testing.assert_close(got_r[0][hit], table[probe[hit]])
