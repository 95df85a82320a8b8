"""The eight DeepRecInfra benchmark models (shared/specs/models.md): their embedding tables and
dense shapes, in the two published row-count variants."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .errors import InvalidRequest

Variant = Literal["deeprecsys", "recssd"]

K = 1_000
M = 1_000_000


@dataclass(frozen=True)
class ModelSpec:
    name: str
    dim: int
    #: rows of each table, DeepRecSys configuration
    rows: tuple[int, ...]
    #: rows of each table, RecSSD's sweep scripts
    rows_recssd: tuple[int, ...]
    #: lookups per table per sample (pooling factor)
    lookups: int
    dense_features: int
    bottom_mlp: tuple[int, ...]
    top_mlp: tuple[int, ...]
    dim_recssd: int | None = None
    lookups_recssd: int | None = None
    note: str = ""

    def table_rows(self, variant: Variant = "deeprecsys") -> tuple[int, ...]:
        return self.rows if variant == "deeprecsys" else self.rows_recssd

    def table_dim(self, variant: Variant = "deeprecsys") -> int:
        return self.dim_recssd if variant == "recssd" and self.dim_recssd else self.dim

    def pooling_factor(self, variant: Variant = "deeprecsys") -> int:
        return self.lookups_recssd if variant == "recssd" and self.lookups_recssd else self.lookups


MODELS: dict[str, ModelSpec] = {
    s.name: s
    for s in [
        ModelSpec("rmc1", 32, (4 * M,) * 8, (1 * M,) * 8, 80, 128, (128, 64, 32),
                  (288, 256, 64, 1)),
        ModelSpec("rmc2", 64, (500 * K,) * 32, (1 * M,) * 32, 120, 256, (256, 128, 64),
                  (2112, 128, 64, 1), note="RecSSD's bottom MLP is 128-64-64"),
        ModelSpec("rmc3", 32, (2 * M,) * 10, (1 * M,) * 10, 20, 2560, (2560, 1024, 256, 32),
                  (352, 512, 256, 1)),
        ModelSpec("wnd", 32, (1 * M,) * 27, (100 * K,) * 27, 1, 512, (),
                  (1376, 1024, 512, 256, 1)),
        ModelSpec("mtwnd", 32, (500 * K,) * 41 + (5 * M,) * 2, (10 * K,) * 41 + (100 * K,) * 2, 1,
                  512, (), (1888, 1024, 512), note="then N task heads 512-256-128"),
        ModelSpec("ncf", 64, (140 * K, 140 * K, 28 * K, 28 * K), (100 * K,) * 4, 1, 0, (),
                  (256, 256, 128, 64), dim_recssd=32),
        ModelSpec("din", 32, (1 * M, 100 * K, 10 * M, 10 * M), (100 * K,) * 254, 3, 0, (),
                  (128, 200, 80, 2),
                  note="RecSSD: 254 tables (profile, 251 behaviour, ad, context); their row "
                       "counts are not published, 100K each is assumed"),
        ModelSpec("dien", 32, (500 * K,) * 41 + (5 * M,) * 2, (10 * K,) * 41 + (100 * K,) * 2, 1,
                  0, (), (160, 200, 80, 2), lookups_recssd=3),
    ]
}


def model_spec(name: str) -> ModelSpec:
    if not isinstance(name, str):
        raise InvalidRequest(f"a model is named by a str (one of {', '.join(MODELS)}), not "
                             f"{name!r}")
    try:
        return MODELS[name.lower()]
    except KeyError:
        raise InvalidRequest(
            f"unknown model {name!r}; expected one of {', '.join(MODELS)}"
        ) from None


def scaled_rows(spec: ModelSpec, variant: Variant = "deeprecsys", rows: int | None = None,
                table_bytes: int | None = None, row_bytes: int | None = None) -> tuple[int, ...]:
    """Rows per table: the variant's, or ``rows`` for every table, or scaled (keeping the tables'
    proportions) so the tables total about ``table_bytes`` bytes of ``row_bytes``-byte rows."""
    base = spec.table_rows(variant)
    if rows is not None and table_bytes is not None:
        raise InvalidRequest("give rows or table_bytes, not both")
    if rows is not None:
        return (int(rows),) * len(base)
    if table_bytes is not None:
        rb = row_bytes or 4 * spec.table_dim(variant)
        scale = table_bytes / (sum(base) * rb)
        return tuple(max(1, round(r * scale)) for r in base)
    return base
