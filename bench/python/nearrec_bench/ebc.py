"""``nearrec bench ebc``: what the TorchRec-shaped surface costs over the engine. On the same
batches of a model's tables (in DRAM), side by side: ``Store.lookup_many`` on prepared
``TableLookup``s (the engine's call), ``nearrec.torch.EmbeddingBagCollection.forward`` on the
same bags as a ``KeyedJaggedTensor`` (the KJT → request conversion included, which the
binding does in Rust from the KJT's own buffers), the module call ``ebc(kjt)`` (forward plus
torch's ``nn.Module.__call__``), and torch's ``nn.EmbeddingBag`` per table on
the same weights (the peer a PyTorch user has). In each round every system runs alone for a
while (rounds rotate the order): a cell is the median of the rounds' medians, with p50 / p99
per batch and the rounds' spread. Then nearrec's three are called in turn on each batch, and an
overhead is the median ratio of calls made next to each other."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import nearrec

from .harness import Harness
from .report import Record, _spread, ratio_text
from .sls import _time_calls

SYSTEMS = ("nearrec.lookup_many", "nearrec.torch.EBC.forward", "nearrec.torch.EBC",
           "torch.EmbeddingBag")


@dataclass
class EbcConfig:
    models: tuple[str, ...] = ("rmc1", "rmc2")
    batches: tuple[int, ...] = (1, 64, 256, 1024)
    rows: int = 200_000
    rounds: int = 5
    seconds: float = 1.0
    seed: int = 0
    threads: int = 2
    scratch: Path = field(default_factory=lambda: Path("bench/scratch"))

    @classmethod
    def quick(cls) -> EbcConfig:
        # five short rounds: a median that one slow round cannot move
        return cls(models=("rmc1",), batches=(1, 64, 1024), rows=50_000, rounds=5,
                   seconds=0.2)


def _systems(store: Any, ebc: Any, bags: list[Any], reqs: list[Any], kjts: list[Any],
             t_ids: list[list[Any]], t_off: Any) -> dict[str, Callable[[int], Any]]:
    """Each system's call on batch ``i`` (the same bags for all three)."""
    import torch

    def torch_eb(i: int) -> Any:
        with torch.no_grad():
            return torch.cat([b(x, t_off) for b, x in zip(bags, t_ids[i], strict=True)], 1)

    return {"nearrec.lookup_many": lambda i: store.lookup_many(reqs[i]),
            "nearrec.torch.EBC.forward": lambda i: ebc.forward(kjts[i]),
            "nearrec.torch.EBC": lambda i: ebc(kjts[i]),
            "torch.EmbeddingBag": torch_eb}


def _interleaved(systems: dict[str, Callable[[int], Any]], seconds: float,
                 n_batches: int) -> dict[str, list[float]]:
    """Seconds per call of each system, called in turn on the same batch (each order of the
    systems in turn) for about ``seconds`` each: the k-th latencies of two systems were taken
    next to each other, so their ratio is free of the machine's drift."""
    orders = list(itertools.permutations(systems))
    lat: dict[str, list[float]] = {s: [] for s in systems}
    spent = 0.0
    k = 0
    while spent < seconds * len(systems) or k < len(orders):
        for s in orders[k % len(orders)]:
            t0 = time.perf_counter()
            systems[s](k % n_batches)
            dt = time.perf_counter() - t0
            lat[s].append(dt)
            spent += dt
        k += 1
    return lat


def run(cfg: EbcConfig, log: Callable[[str], None] = print) -> list[Record]:
    import torch

    from nearrec.torch import EmbeddingBagCollection, KeyedJaggedTensor

    torch.set_num_threads(cfg.threads)
    rng = np.random.default_rng(cfg.seed)
    records: list[Record] = []
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    for model in cfg.models:
        spec = nearrec.model_spec(model)
        rows = min(cfg.rows, max(spec.rows))
        path = cfg.scratch / f"ebc-{model}-{rows}"
        log(f"[{model}] {len(spec.rows)} tables x {rows} rows x dim {spec.dim}")
        nearrec.build(path, model, rows=rows, seed=cfg.seed, overwrite=True, progress=False)
        store = nearrec.open(path, tier="dram", threads=cfg.threads)
        names = list(store.tables)
        ebc = EmbeddingBagCollection(store, names)
        bags = [torch.nn.EmbeddingBag.from_pretrained(
            torch.from_numpy(store.table_array(n)).clone(), mode="sum", freeze=True)
            for n in names]
        L = spec.lookups
        for batch in cfg.batches:
            n = 8
            ids = [[rng.integers(0, store.table(t).rows, batch * L) for t in names]
                   for _ in range(n)]
            lengths = np.full(batch, L, dtype=np.int64)
            offsets = np.arange(0, batch * L, L, dtype=np.int64)
            reqs = [[nearrec.TableLookup(t, x, lengths=lengths) for t, x in zip(names, s,
                                                                                 strict=True)]
                    for s in ids]
            kjts = [KeyedJaggedTensor(names, torch.from_numpy(np.concatenate(s)),
                                      lengths=torch.from_numpy(np.tile(lengths, len(names))))
                    for s in ids]
            t_ids = [[torch.from_numpy(x) for x in s] for s in ids]
            systems = _systems(store, ebc, bags, reqs, kjts, t_ids, torch.from_numpy(offsets))
            torch_eb = systems["torch.EmbeddingBag"]
            # the same answers, or the comparison means nothing
            want = store.lookup_many(reqs[0]).values
            np.testing.assert_allclose(ebc(kjts[0]).values().numpy(), want, rtol=1e-5,
                                       atol=1e-5)
            np.testing.assert_allclose(torch_eb(0).numpy(), want, rtol=1e-4, atol=1e-4)
            # throughput: each system alone for a while, rounds rotating the order; overheads:
            # nearrec's systems called in turn on each batch (torch apart: its OpenMP threads
            # spin after a call, slowing whatever follows)
            per: dict[str, list[list[float]]] = {s: [] for s in systems}
            order = list(systems)
            nearrecs = {s: f for s, f in systems.items() if s.startswith("nearrec")}
            paired: dict[str, list[list[float]]] = {s: [] for s in nearrecs}
            for rnd in range(cfg.rounds):
                for s in order[rnd % len(order):] + order[:rnd % len(order)]:
                    per[s].append(_time_calls(systems[s], cfg.seconds, n))
                for s, lat in _interleaved(nearrecs, cfg.seconds, n).items():
                    paired[s].append(lat)
            for s, rounds in per.items():
                medians = [float(np.median(x)) for x in rounds]
                all_lat = np.concatenate(rounds) * 1e6
                med = float(np.median(medians))
                records.append(Record(
                    "ebc", model, batch, "uniform", s, samples_per_s=batch / med,
                    lookups_per_s=batch * L * len(names) / med,
                    p50_us=float(np.percentile(all_lat, 50)),
                    p99_us=float(np.percentile(all_lat, 99)),
                    extra={"rounds_samples_per_s": [batch / m for m in medians]}))
            cell = {r.system: r for r in records[-len(systems):]}
            ours, forward = cell["nearrec.torch.EBC"], cell["nearrec.torch.EBC.forward"]
            base = paired["nearrec.lookup_many"]
            for r in (ours, forward):
                # each call against lookup_many's call on the same batch next to it
                ratios = [np.asarray(x) / np.asarray(b) for x, b in zip(paired[r.system], base,
                                                                        strict=True)]
                r.extra["overhead_vs_lookup_many"] = round(
                    float(np.median(np.concatenate(ratios))) - 1, 4)
                r.extra["rounds_overhead"] = [round(float(np.median(x)) - 1, 4) for x in ratios]
            ours.extra["ratio_vs_torch"] = round(
                ours.samples_per_s / cell["torch.EmbeddingBag"].samples_per_s, 3)
            log(f"  batch {batch}: over lookup_many, EBC.forward "
                f"{100 * forward.extra['overhead_vs_lookup_many']:+.1f} %, the module call "
                f"{100 * ours.extra['overhead_vs_lookup_many']:+.1f} %; EBC ÷ torch "
                f"{ours.extra['ratio_vs_torch']:.2f}")
    return records


def _overhead(r: Record) -> str:
    rounds = r.extra["rounds_overhead"]
    return (f"{100 * r.extra['overhead_vs_lookup_many']:+.1f} % "
            f"({100 * min(rounds):+.1f}…{100 * max(rounds):+.1f})")


def markdown(records: list[Record], command: str) -> str:
    lines = [f"Command: `{command}`", "",
             "Samples/s (median of rounds, each system alone in a round, rounds in rotating "
             "order), p50 / p99 µs per batch. Tables in DRAM, sum pooling, uniform ids, 2 "
             "threads. The overheads are how much slower than "
             "`Store.lookup_many` on the same bags as prepared `TableLookup`s "
             "`nearrec.torch.EmbeddingBagCollection.forward` is on a `KeyedJaggedTensor` (the "
             "goal is ≤ 5 %), and the module call `ebc(kjt)`, which adds torch's "
             "`nn.Module.__call__` (about 1 µs, the same for any module): in each round the three "
             "nearrec calls are also made in turn on each batch (every order in turn), and an "
             "overhead is the median ratio of calls made next to each other, − 1, with the "
             "range of the rounds' medians; "
             "`EBC ÷ torch` compares the module call with torch's `nn.EmbeddingBag` per table "
             "on the same weights.", "",
             "| model | batch | lookup_many | EBC.forward | EBC module call | "
             "torch.EmbeddingBag | EBC p50 / p99 µs | forward overhead | call overhead | "
             "EBC ÷ torch | spread (EBC) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    cells: dict[tuple[str, int], dict[str, Record]] = {}
    for r in records:
        cells.setdefault((r.model, r.batch), {})[r.system] = r
    for (model, batch), c in cells.items():
        e, f = c["nearrec.torch.EBC"], c["nearrec.torch.EBC.forward"]
        lines.append(
            f"| {model} | {batch} | {c['nearrec.lookup_many'].samples_per_s:,.0f} | "
            f"{f.samples_per_s:,.0f} | {e.samples_per_s:,.0f} | "
            f"{c['torch.EmbeddingBag'].samples_per_s:,.0f} | "
            f"{e.p50_us:,.0f} / {e.p99_us:,.0f} | "
            f"{_overhead(f)} | {_overhead(e)} | "
            f"{ratio_text(e, c['torch.EmbeddingBag'])} | {_spread(e)} |")
    return "\n".join(lines) + "\n"


#: ``nearrec bench ebc``
HARNESSES = {"ebc": Harness(EbcConfig, EbcConfig.quick,
                            {"--models": "models", "--rows": "rows", "--scratch": "scratch"},
                            run, markdown)}
