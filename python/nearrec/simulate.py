"""``nearrec.simulate``: the flash device model (``nearrec-device``) from Python.

A simulation feeds a model's tables a generated trace, batch after batch, through one design
(``MODES``: SSD-S, EMB-MMIO, EMB-PageSum, EMB-VectorSum, RecSSD, RM-SSD, EMB-SSD) on one drive
(``DEVICES``: RM-SSD's emulated SSD, RecSSD's Cosmos+ OpenSSD, this machine's disk as fitted), and
reports simulated latency (p50 / p99), throughput, flash reads, link bytes and read amplification.
Everything here is simulated time; nothing is measured on this machine except by ``calibrate``.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ._native import (
    device_fit,
    device_preset,
    device_read_rate,
    device_simulate,
    disk_read_rate,
    table_layout,
)
from .errors import InvalidRequest, StoreIOError
from .request import count, flag, is_bool, path_arg, regular_file
from .specs import model_spec, scaled_rows

DEVICES = ("rm-ssd", "cosmos-plus", "this-disk")
MODES = ("ssd-s", "emb-mmio", "emb-pagesum", "emb-vectorsum", "recssd", "rm-ssd", "emb-ssd")
#: EMB-SSD with one technique or none (its Fig. 9)
EMB_SSD_VARIANTS = ("emb-ssd:base", "emb-ssd:merge", "emb-ssd:cache")
#: what a sweep may vary
SWEEPABLE = ("batch", "k", "pooling", "dim", "dtype", "tables", "rows")


def device(spec: str | dict[str, Any] | Path = "rm-ssd", **overrides: Any) -> dict[str, Any]:
    """A drive's parameter set: a preset's name, a JSON file, or a dict; ``overrides`` set fields by
    dotted path with ``__`` for the dot (``host__dram_bytes=1 << 30``)."""
    cfg: dict[str, Any]
    if isinstance(spec, Mapping):
        try:
            cfg = json.loads(json.dumps(dict(spec)))
        except (TypeError, ValueError) as e:
            raise InvalidRequest(f"a device dict must hold JSON values only: {e}") from None
    elif isinstance(spec, str) and spec in DEVICES:
        cfg = json.loads(device_preset(spec))
    else:
        if not isinstance(spec, str | os.PathLike):
            raise InvalidRequest(f"device must be a preset ({', '.join(DEVICES)}), a JSON file "
                                 f"or a dict, not {type(spec).__name__} {spec!r:.60}")
        path = Path(path_arg(spec, "device"))
        if not path.exists():
            raise InvalidRequest(f"no device {spec!r}: a preset ({', '.join(DEVICES)}) or a "
                                 "JSON file")
        regular_file(path, "device")
        try:
            cfg = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InvalidRequest(f"device file {str(path)!r} is not JSON: {e}") from None
        except OSError as e:
            raise StoreIOError(f"device file {str(path)!r} cannot be read: {e.strerror or e}"
                               ) from None
        if not isinstance(cfg, dict):
            raise InvalidRequest(f"device file {str(path)!r} must hold a JSON object, not "
                                 f"{type(cfg).__name__}")
    for key, value in overrides.items():
        set_field(cfg, key.replace("__", "."), value)
    return cfg


def set_field(cfg: dict[str, Any], dotted: str, value: Any) -> None:
    """Sets ``a.b.c`` in a nested parameter set, refusing names it does not have."""
    if not isinstance(cfg, dict):
        raise InvalidRequest(f"set_field takes a device dict, not {type(cfg).__name__} "
                             f"{cfg!r:.60}")
    if not isinstance(dotted, str) or not dotted:
        raise InvalidRequest(f"a device field is a dotted name such as 'host.dram_bytes', not "
                             f"{dotted!r:.60}")
    *path, last = dotted.split(".")
    node = cfg
    for part in path:
        if not isinstance(node.get(part), dict):
            raise InvalidRequest(f"device has no section {dotted!r}")
        node = node[part]
    if last not in node:
        raise InvalidRequest(f"device has no field {dotted!r}; it has {', '.join(node)}")
    kind = float if isinstance(node[last], float) else type(node[last])
    try:
        node[last] = kind(value)
    except (TypeError, ValueError):
        raise InvalidRequest(f"device field {dotted!r} takes a {kind.__name__}, not {value!r}"
                             ) from None


def workload(model: str, rows: int | None = None, dim: int | None = None,
             tables: int | None = None, placement: str = "packed",
             variant: str = "deeprecsys", table_bytes: int | None = None,
             dtype: str = "fp32") -> dict[str, Any]:
    """A benchmark model's tables and dense layers as the drive sees them; ``rows``, ``dim`` and
    ``tables`` replace the model's own (for sweeps), ``table_bytes`` scales the rows to a total;
    ``placement="one-per-page"`` stores one row per flash page, as RecSSD's evaluation assumes;
    ``dtype`` (fp32, fp16, bf16, int8, int4, int2, fp8) sets each row's bytes, as the store
    encodes it."""
    rows = None if rows is None else count(rows, "rows")
    dim = None if dim is None else count(dim, "dim")
    tables = None if tables is None else count(tables, "tables")
    table_bytes = None if table_bytes is None else count(table_bytes, "table_bytes")
    spec = model_spec(model)
    d = dim or spec.table_dim(variant)  # type: ignore[arg-type]
    # a row's bytes as the store encodes it (int8 rows carry a scale and bias); an unknown
    # dtype is a typed error
    row_bytes = table_layout(1, d, dtype)[0]
    n_rows = scaled_rows(spec, variant, rows=rows,  # type: ignore[arg-type]
                         table_bytes=table_bytes, row_bytes=row_bytes)
    n = tables or len(n_rows)
    row_counts = [n_rows[i % len(n_rows)] for i in range(n)]
    bottom = list(spec.bottom_mlp)
    top = list(spec.top_mlp)
    if top:
        # The top MLP's input holds the pooled tables beside dense inputs; a sweep over tables or
        # dim changes only the pooled part.
        base_d = spec.table_dim(variant)  # type: ignore[arg-type]
        top[0] += n * d - len(n_rows) * base_d
    if top and top[-1] not in (1, 2):
        top.append(1)
    return {
        "tables": [{"name": f"{model}-{i}", "rows": r, "dim": d, "dtype": dtype}
                   for i, r in enumerate(row_counts)],
        "bottom": bottom,
        "top": top,
        "placement": placement,
    }


def generator(k: float | None = 0.3, stride: int | None = None,
              sequential: bool = False) -> dict[str, Any]:
    """RecSSD's locality-controlled stack-distance trace (``k``; higher: less locality), with
    strided ids when ``stride`` is given (its STR pattern); ``k=None`` is uniform;
    ``sequential`` gives consecutive ids (its SEQ pattern)."""
    if flag(sequential, "sequential"):
        return {"kind": "sequential"}
    if k is None:
        return {"kind": "uniform"}
    if is_bool(k) or not isinstance(k, int | float) or not 0.0 <= k < float("inf"):
        raise InvalidRequest(f"k (RecSSD's locality knob) must be a number ≥ 0 or None, not {k!r}")
    if stride is not None:
        stride = count(stride, "stride")
    ids: dict[str, Any] = {"kind": "strided", "stride": stride} if stride else {"kind": "full"}
    return {"kind": "stack_distance", "k": k, "variant": "continuous", "ids": ids}


def _mode(name: str) -> dict[str, Any]:
    if name.startswith("emb-ssd"):
        variant = name.partition(":")[2] or "both"
        if variant not in ("both", "base", "merge", "cache"):
            raise InvalidRequest(f"unknown mode {name!r}")
        return {"kind": "emb-ssd", "merging": variant in ("both", "merge"),
                "caching": variant in ("both", "cache")}
    if name not in MODES:
        raise InvalidRequest(f"unknown mode {name!r}; expected one of "
                             f"{', '.join(MODES + EMB_SSD_VARIANTS)}")
    return {"kind": name}


def run(model: str | dict[str, Any] = "rmc1", dev: str | dict[str, Any] = "rm-ssd",
        mode: str = "rm-ssd", batch: int = 1, batches: int = 20, warmup: int = 20,
        pooling: int | None = None, k: float | None = 0.3, stride: int | None = None,
        sequential: bool = False, seed: int = 0, **workload_args: Any) -> dict[str, Any]:
    """One simulation; returns its report (simulated times in ms, throughput in samples/s)."""
    batch = count(batch, "batch")
    batches = count(batches, "batches")
    warmup = count(warmup, "warmup", minimum=0)
    seed = count(seed, "seed", minimum=0)
    if pooling is not None:
        pooling = count(pooling, "pooling")
    w = workload(model, **workload_args) if isinstance(model, str) else model
    name = model if isinstance(model, str) else "custom"
    if pooling is None:
        pooling = model_spec(model).lookups if isinstance(model, str) else 1
    spec = {
        "workload": w, "device": device(dev), "mode": _mode(mode), "batch": batch,
        "batches": batches, "warmup": warmup, "pooling": pooling,
        "generator": generator(k, stride, sequential), "seed": seed,
    }
    report: dict[str, Any] = json.loads(device_simulate(json.dumps(spec)))
    report.update(model=name, k=k, pooling=pooling, dim=w["tables"][0]["dim"],
                  dtype=w["tables"][0].get("dtype", "fp32"),
                  tables=len(w["tables"]), rows=w["tables"][0]["rows"])
    return report


def sweep(models: Sequence[str] = ("rmc1",), dev: str | dict[str, Any] = "rm-ssd",
          modes: Sequence[str] = MODES, over: dict[str, Iterable[Any]] | None = None,
          **fixed: Any) -> list[dict[str, Any]]:
    """Every combination of model × mode × the values in ``over`` (keys from ``SWEEPABLE``).
    When SSD-S is among the modes, each report gains ``traffic_reduction``: the bytes SSD-S read
    back over the link at the same point ÷ this design's (RM-SSD's Table IV)."""
    for what, names in (("models", models), ("modes", modes)):
        if isinstance(names, str) or not isinstance(names, Sequence):
            raise InvalidRequest(f"{what} is a sequence of names, not {names!r:.60}")
    if over is not None and not isinstance(over, Mapping):
        raise InvalidRequest(f"over maps sweepable keys to their values, not {over!r:.60}")
    over = dict(over or {})
    for key, values in over.items():
        if isinstance(values, str) or not isinstance(values, Iterable):
            raise InvalidRequest(f"over[{key!r}] is the values to sweep, not {values!r:.60}")
        over[key] = list(values)
    for key in over:
        if key not in SWEEPABLE:
            raise InvalidRequest(f"cannot sweep {key!r}; sweepable: {', '.join(SWEEPABLE)}")
    out = []
    keys = list(over)
    for model, mode, values in itertools.product(models, modes,
                                                 itertools.product(*over.values())):
        args = dict(fixed, **dict(zip(keys, values, strict=True)))
        out.append(run(model, dev, mode, **args))
    point = ("model", *keys)
    base = {tuple(r[k] for k in point): r for r in out if r["mode"] == "ssd-s"}
    for r in out:
        b = base.get(tuple(r[k] for k in point))
        if b is not None:
            r["traffic_reduction"] = b["link_read_bytes"] / max(1, r["link_read_bytes"])
    return out


#: The parameters a sweep can vary (``sweep``'s ``over``).
PARAMETERS = ("batch", "k", "lookups", "dim", "dtype", "tables", "rows")


def plot_lines(reports: Sequence[dict[str, Any]], x: str, y: str
               ) -> list[tuple[int, int, str, list[tuple[Any, Any]]]]:
    """The lines :func:`plot` draws: ``(design number, line number within it, label, points)``.
    One per design (model and mode) and value of every other parameter the reports sweep; a
    parameter whose every value gives a design the same line is folded, and the label says so;
    a line within 1 % of one drawn before it is labelled as lying on it."""
    # a parameter is swept where two reports of one design at one x differ in it (a report's
    # `lookups` follows its batch: not swept when batch is x)
    seen: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in reports:
        seen.setdefault((r["model"], r["mode"], r[x]), []).append(r)
    swept = [p for p in PARAMETERS if p != x and any(
        len({r.get(p) for r in group}) > 1 for group in seen.values())]
    series: dict[tuple[str, str], dict[tuple[Any, ...], list[tuple[Any, Any]]]] = {}
    for r in reports:
        design = (r["model"], r["mode"])
        series.setdefault(design, {}).setdefault(tuple(r[p] for p in swept), []).append(
            (r[x], r[y]))
    models = {m for m, _ in series}
    out = []
    for n, (design, lines) in enumerate(series.items()):
        for pts in lines.values():
            pts.sort()
        idle = [p for i, p in enumerate(swept) if _coincide(lines, i)]
        moving = [p for p in swept if p not in idle]
        kept: dict[tuple[Any, ...], list[tuple[Any, Any]]] = {}
        for values, pts in lines.items():
            kept.setdefault(tuple(v for p, v in zip(swept, values, strict=True)
                                  if p not in idle), pts)
        name = design[1] if len(models) == 1 else f"{design[0]} {design[1]}"
        for j, (values, pts) in enumerate(kept.items()):
            label = name + "".join(f", {p}={v}" for p, v in zip(moving, values, strict=True))
            if idle:
                label += f" ({', '.join(idle)}: no effect)"
            out.append((n, j, label, pts))
    # a line that another design's drawn before it covers (within 1 % everywhere) says so
    named: list[tuple[str, list[tuple[Any, Any]]]] = []
    for n, j, label, pts in out:
        same = next((other for other, opts in named if len(opts) == len(pts) and all(
            a[0] == b[0] and abs(float(a[1]) - float(b[1])) <= 0.01 * max(abs(float(b[1])), 1e-12)
            for a, b in zip(pts, opts, strict=True))), None)
        named.append((label, pts))
        if same is not None:
            out[len(named) - 1] = (n, j, f"{label} (≈ {same})", pts)
    return out


def plot(reports: Sequence[dict[str, Any]], x: str, y: str, path: str | Path,
         title: str = "", logy: bool = False) -> Path:
    """``y`` over ``x`` (PNG; needs matplotlib): the lines of :func:`plot_lines`, a colour per
    design and a line style per value of the other swept parameters, so that no sweep folds into
    another's line and no design hides another."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = ["-", "--", ":", "-.", (0, (1, 1)), (0, (5, 1))]
    markers = ["o", "s", "^", "v", "D", "x"]
    fig, ax = plt.subplots(figsize=(8.0, 5.0))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for n, j, label, pts in plot_lines(reports, x, y):
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label,
                color=colours[n % len(colours)], linestyle=styles[j % len(styles)],
                marker=markers[j % len(markers)], markersize=4)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if logy:
        ax.set_yscale("log")
    ax.set_title(title or f"{y} over {x} (simulated)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _coincide(lines: dict[tuple[Any, ...], list[tuple[Any, Any]]], i: int) -> bool:
    """Whether the lines that differ only in parameter ``i`` are the same line."""
    groups: dict[tuple[Any, ...], list[list[tuple[Any, Any]]]] = {}
    for values, pts in lines.items():
        groups.setdefault(values[:i] + values[i + 1:], []).append(pts)
    return all(all(len(p) == len(g[0]) and all(
        a[0] == b[0] and abs(float(a[1]) - float(b[1])) <= 1e-9 * max(1.0, abs(float(b[1])))
        for a, b in zip(p, g[0], strict=True)) for p in g[1:]) for g in groups.values()) and \
        any(len(g) > 1 for g in groups.values())


def read_rate(dev: str | dict[str, Any], queue_depth: int, nbytes: int = 512) -> float:
    """The model's random-read rate (reads/s) at a queue depth."""
    queue_depth = count(queue_depth, "queue_depth", maximum=1 << 20)
    nbytes = count(nbytes, "nbytes", maximum=1 << 40)
    return float(device_read_rate(json.dumps(device(dev)), queue_depth, nbytes))


def calibrate(files: Sequence[str | Path], depths: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128),
              reads: int = 20_000, base: str | dict[str, Any] = "this-disk", seed: int = 0,
              repeats: int = 3, weights: dict[int, float] | None = None
              ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Measures this disk's direct random-read rate over ``files`` at each depth (the median of
    ``repeats`` probes, each at blocks never probed before, from ``seed``) and fits the model to
    it, each depth counting ``weights[depth]`` (1 by default); returns the fitted parameter set and
    the points (measured and predicted)."""
    if isinstance(files, str | bytes | os.PathLike) or not isinstance(files, Sequence):
        raise InvalidRequest(f"calibrate takes a list of files, not {files!r:.60}")
    if not files:
        raise InvalidRequest("calibrate needs at least one file to read")
    paths = [regular_file(f, f"calibrate: files[{i}]") for i, f in enumerate(files)]
    if isinstance(depths, str | bytes) or not isinstance(depths, Sequence) or not depths:
        raise InvalidRequest(f"depths must be a non-empty list of queue depths, not "
                             f"{depths!r:.60}")
    depths = [count(d, f"depths[{i}]", maximum=1 << 20) for i, d in enumerate(depths)]
    reads = count(reads, "reads")
    repeats = count(repeats, "repeats")
    seed = count(seed, "seed", minimum=0)
    if weights is not None and not isinstance(weights, Mapping):
        raise InvalidRequest(f"weights must map queue depth to weight, not {weights!r:.60}")
    base_cfg = device(base)
    points: list[dict[str, Any]] = []
    for i, qd in enumerate(depths):
        n = max(reads, 200 * qd) if qd > 1 else max(reads // 20, 500)
        rates = sorted(disk_read_rate(paths, n, qd, (seed * 1000 + i) * 16 + rep + 11)
                       for rep in range(repeats))
        points.append({"queue_depth": qd, "bytes": 512, "reads_per_s": rates[len(rates) // 2],
                       "probes": rates, "weight": (weights or {}).get(qd, 1.0)})
    fitted = json.loads(device_fit(json.dumps(base_cfg), json.dumps(points)))
    fitted["name"] = "this-disk"
    for p in points:
        p["predicted_reads_per_s"] = read_rate(fitted, p["queue_depth"], p["bytes"])
    return fitted, points
