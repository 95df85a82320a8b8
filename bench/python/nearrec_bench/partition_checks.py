"""The partition harness's workload and the checks of what it saw (``partitions.py`` runs it):
replicas alike, final reads as every replica holds them, no pair read half, no router read
going back, each row's history linearizable (``linearizable.py``); and what each fault cost
the routers' calls."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .linearizable import Op, check

#: the table: ROWS rows of DIM, cut row-wise over two shards (rows < ROWS/2 on shard 0)
ROWS, DIM = 64, 8
#: rows written alone, on each shard; rows of the pairs written in one call (one per shard)
SINGLES = [1, 2, 3, 4, 33, 34, 35, 36]
PAIRS = [(10, 42), (11, 43)]


# --- the checks ------------------------------------------------------------------------------


def judge(history: list[dict[str, Any]], last: dict[str, Any]) -> list[str]:
    """What the history and the replicas' last state show wrong (empty: nothing)."""
    found = []
    for h in last["reads"]:
        if h["outcome"] != "ok":
            found.append(f"row {h['ids'][0]} is not read after the heal: {h['error']}")
    for name, r in last["replicas"].items():
        if "error" in r:
            found.append(f"replica {name} does not serve after the heal: {r['error']}")
    # replicas of a shard alike
    for k in (0, 1) if last["replicas"] else ():
        a, b = last["replicas"][f"n{k}0"], last["replicas"][f"n{k}1"]
        if "error" in a or "error" in b:
            continue
        if a["digests"] != b["digests"] or a["version"] != b["version"]:
            differ = [r for r in a["rows"] if a["rows"][r] != b["rows"][r]]
            found.append(f"shard {k}: replicas differ (versions {a['version']} / "
                         f"{b['version']}; rows {differ[:8]})")
    # the final reads agree with every replica's rows
    for h in last["reads"]:
        i = h["ids"][0]
        for name, r in last["replicas"].items():
            if h["outcome"] != "ok" or "error" in r:
                continue
            if int(name[1]) == i // (ROWS // 2) and r["rows"][str(i)] != h["values"][0]:
                found.append(f"row {i}: read {h['values'][0]} through a router, {name} holds "
                             f"{r['rows'][str(i)]}")
    # no pair read half
    pairs = {tuple(p) for p in PAIRS}
    for h in history:
        if h["kind"] == "read" and h["outcome"] == "ok" and tuple(h["ids"]) in pairs \
                and h["values"][0] != h["values"][1]:
            found.append(f"a read of rows {h['ids']} saw {h['values']}: half of a cross-shard "
                         f"write")
    # no router read going back (per router, per row: a later read returning a value whose
    # write finished before the write of what an earlier read returned began)
    writes = {}
    for h in history:
        if h["kind"] == "write":
            for v in h["values"]:
                writes[v] = h
    for router in {h["router"] for h in history if h["router"] >= 0}:
        reads = sorted((h for h in history if h["router"] == router and h["kind"] == "read"
                        and h["outcome"] == "ok"), key=lambda h: h["invoke"])
        seen: dict[int, dict[str, Any]] = {}
        for h in reads:
            for i, v in zip(h["ids"], h["values"], strict=True):
                before = seen.get(i)
                if before is not None and before["complete"] < h["invoke"]:
                    old, new = writes.get(before["v"]), writes.get(v)
                    if old is not None and (v == 0 or (new is not None and new["outcome"] == "ok"
                                                       and new["complete"] < old["invoke"])):
                        found.append(f"router {router} read row {i} as {v} after reading "
                                     f"{before['v']}: it went back")
                seen[i] = {"v": v, "complete": h["complete"]}
    # linearizable, each row a register
    ops = []
    for h in history:
        for i, v in zip(h["ids"], h["values"] or [None] * len(h["ids"]), strict=True):
            if h["kind"] == "write":
                # a write that failed was applied nowhere, unless its error says it is in doubt
                # or committed (docs/distributed.md, "Writes"): then it may have taken effect
                # at any time, or never; were the rule broken, a read of a value never applied
                # would show it here
                complete = h["complete"] / 1e9 if h["outcome"] == "ok" else None
                ok = h["outcome"] == "ok" or in_doubt(h["error"])
                ops.append(Op("write", i, v, h["invoke"] / 1e9, complete, ok,
                              client=h["router"] * 100 + h["thread"]))
            elif h["outcome"] == "ok":
                ops.append(Op("read", i, v, h["invoke"] / 1e9, h["complete"] / 1e9,
                              client=h["router"] * 100 + h["thread"]))
    verdict = check(ops, initial=0)
    if not verdict:
        found.append(str(verdict)[:2000])
    return found


def in_doubt(error: str | None) -> bool:
    """Whether a write's error leaves its outcome open (the router says when it is)."""
    return error is not None and ("in doubt" in error or "is committed" in error)


def phases(history: list[dict[str, Any]],
           windows: list[tuple[str, float, float]]) -> dict[str, dict[str, list[float]]]:
    """Each call's latency (ms; -1: failed) by what the nemesis was doing when it began — a
    fault's window (a call begun before and still running counts as the fault's), or none —
    and by kind (write, read)."""
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for h in history:
        phase = next((what for what, b, e in windows
                      if b <= h["invoke"] <= e or h["invoke"] < b <= h["complete"]), "none")
        took = (h["complete"] - h["invoke"]) / 1e6 if h["outcome"] == "ok" else -1.0
        out[phase][h["kind"]].append(round(took, 2))
    return {k: dict(v) for k, v in out.items()}


def _quantile(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def costs(results: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per phase (a fault, or none) and kind: calls, error rate, p50 and p99 of the answered
    ones (ms), over every schedule."""
    pooled: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        for phase, kinds in r.get("phases", {}).items():
            for kind, took in kinds.items():
                pooled[phase][kind].extend(took)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for phase, kinds in sorted(pooled.items()):
        out[phase] = {}
        for kind, took in sorted(kinds.items()):
            ok = sorted(t for t in took if t >= 0)
            out[phase][kind] = {"calls": len(took), "error_rate": 1 - len(ok) / len(took),
                                "p50_ms": _quantile(ok, 0.5), "p99_ms": _quantile(ok, 0.99)}
    return out
