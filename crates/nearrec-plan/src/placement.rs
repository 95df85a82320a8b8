//! Where each table's rows live in DRAM: what the planner decides and the engine applies.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// DRAM placement of a store's tables, by table name. Tables it does not name get no DRAM tier.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    pub tables: BTreeMap<String, TablePlacement>,
}

/// One table's DRAM tiers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TablePlacement {
    /// Keep the whole table in DRAM (the other fields are then ignored).
    pub resident: bool,
    /// Rows pinned in the hot partition (distinct).
    pub hot_rows: Vec<u64>,
    /// Bytes of the dynamic row cache (0: none); read as an integer or a size such as
    /// `"64MiB"`.
    #[serde(deserialize_with = "crate::units::bytes")]
    pub cache_bytes: u64,
}

/// A table as the default placement sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TableSize<'a> {
    pub name: &'a str,
    pub bytes: u64,
}

impl Placement {
    /// The placement without a trace to go by: every table that fits its fair share of what is
    /// left (smallest first) is kept whole; the rest of the budget becomes row caches in
    /// proportion to the other tables' sizes. (Equal lookups per table is the only assumption:
    /// then a small table kept whole gives the most hits per byte.)
    pub fn by_size(tables: &[TableSize<'_>], budget: u64) -> Self {
        let mut order: Vec<&TableSize<'_>> = tables.iter().collect();
        order.sort_by_key(|t| t.bytes);
        let mut left = budget;
        let mut out = Placement::default();
        // smallest first: a table that does not fit its share leaves every larger one out too
        let kept = order
            .iter()
            .enumerate()
            .take_while(|&(i, t)| {
                let fits = t.bytes <= left / (order.len() - i) as u64;
                if fits {
                    left -= t.bytes;
                }
                fits
            })
            .count();
        for t in &order[..kept] {
            out.tables.insert(
                t.name.to_owned(),
                TablePlacement {
                    resident: true,
                    ..TablePlacement::default()
                },
            );
        }
        let rest = &order[kept..];
        let rest_bytes: u64 = rest.iter().map(|t| t.bytes).sum();
        for t in rest.iter() {
            let cache_bytes =
                (u128::from(left) * u128::from(t.bytes) / u128::from(rest_bytes.max(1))) as u64;
            out.tables.insert(
                t.name.to_owned(),
                TablePlacement {
                    cache_bytes,
                    ..TablePlacement::default()
                },
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_tables_are_kept_whole_and_the_rest_is_cache() {
        let t = |name, bytes| TableSize { name, bytes };
        let p = Placement::by_size(&[t("big", 8_000), t("tiny", 100), t("mid", 2_000)], 3_000);
        assert!(p.tables["tiny"].resident);
        assert!(!p.tables["mid"].resident && !p.tables["big"].resident);
        assert_eq!(p.tables["mid"].cache_bytes, 2_900 * 2_000 / 10_000);
        assert_eq!(p.tables["big"].cache_bytes, 2_900 * 8_000 / 10_000);
        let total: u64 = p.tables.values().map(|t| t.cache_bytes).sum::<u64>() + 100;
        assert!(total <= 3_000);
        // everything fits: everything resident
        let all = Placement::by_size(&[t("a", 10), t("b", 20)], 30);
        assert!(all.tables.values().all(|p| p.resident));
        // equal tables none of which fits its share: all caches, the budget split evenly
        let equal = Placement::by_size(&[t("a", 100), t("b", 100), t("c", 100), t("d", 100)], 200);
        assert!(
            equal
                .tables
                .values()
                .all(|p| !p.resident && p.cache_bytes == 50)
        );
        // no budget: no tiers
        let none = Placement::by_size(&[t("a", 10)], 0);
        assert_eq!(none.tables["a"], TablePlacement::default());
    }
}
