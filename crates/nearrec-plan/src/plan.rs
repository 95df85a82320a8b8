//! What the planner decides: per table, whether it lives in DRAM whole, which rows are pinned and
//! how large a row cache it gets, with the numbers behind the choice.

use std::fmt;

use crate::curves::{Curve, HOT_ROW_OVERHEAD};
use crate::placement::{Placement, TablePlacement};

/// EMB-SSD's table types, from the working set (small: at most 10 % of the rows) and the
/// locality (the LRU hit ratio of a cache of 10 % of the working set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TableKind {
    /// Small working set, high locality (≥ 0.5).
    A,
    /// Small working set, low locality.
    B,
    /// Large working set, moderate locality (≥ 0.2).
    C,
    /// Large working set, low locality: caching buys little.
    D,
}

impl TableKind {
    pub fn of(working_set: u64, rows: u64, locality: f64) -> Self {
        let small = working_set as f64 <= 0.1 * rows as f64;
        match (small, locality) {
            (true, l) if l >= 0.5 => Self::A,
            (true, _) => Self::B,
            (false, l) if l >= 0.2 => Self::C,
            (false, _) => Self::D,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::A => "A",
            Self::B => "B",
            Self::C => "C",
            Self::D => "D",
        }
    }
}

impl fmt::Display for TableKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// One table's share of the budget.
#[derive(Debug, Clone, PartialEq)]
pub struct TablePlan {
    pub table: String,
    pub rows: u64,
    pub row_bytes: u64,
    pub table_bytes: u64,
    /// Lookups of this table in the scored half of the trace.
    pub lookups: u64,
    pub working_set: u64,
    /// LRU hit ratio with a cache of 10 % of the working set.
    pub locality: f64,
    pub kind: TableKind,
    pub resident: bool,
    /// Rows to pin, most frequent first.
    pub hot_rows: Vec<u64>,
    pub cache_bytes: u64,
    /// The share of lookups the plan expects DRAM to serve (on the scored half).
    pub expected_hit_ratio: f64,
    pub curve: Curve,
}

impl TablePlan {
    /// The DRAM bytes the table gets: the whole table, or its pinned rows and row cache.
    pub fn bytes(&self) -> u64 {
        if self.resident {
            return self.table_bytes;
        }
        self.hot_rows.len() as u64 * (self.row_bytes + HOT_ROW_OVERHEAD) + self.cache_bytes
    }

    pub fn placement(&self) -> TablePlacement {
        TablePlacement {
            resident: self.resident,
            hot_rows: self.hot_rows.clone(),
            cache_bytes: self.cache_bytes,
        }
    }
}

/// A DRAM budget planned over a store's tables for a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub budget: u64,
    /// In the trace's order; tables the trace does not cover get nothing and are not listed.
    pub tables: Vec<TablePlan>,
    /// The trace file planned from ("" when the trace was not a file).
    pub trace: String,
    /// The store planned for ("" when not known).
    pub store: String,
}

impl Plan {
    pub fn bytes(&self) -> u64 {
        self.tables.iter().map(TablePlan::bytes).sum()
    }

    /// The share of all lookups (of the scored half) the plan expects DRAM to serve.
    pub fn expected_hit_ratio(&self) -> f64 {
        let lookups: u64 = self.tables.iter().map(|t| t.lookups).sum();
        let hits = self
            .tables
            .iter()
            .fold(0.0, |acc, t| acc + t.lookups as f64 * t.expected_hit_ratio);
        hits / lookups.max(1) as f64
    }

    pub fn table(&self, name: &str) -> Option<&TablePlan> {
        self.tables.iter().find(|t| t.table == name)
    }

    /// What the engine applies (what `nearrec.open(plan=...)` takes).
    pub fn placement(&self) -> Placement {
        Placement {
            tables: self
                .tables
                .iter()
                .map(|t| (t.table.clone(), t.placement()))
                .collect(),
        }
    }

    /// The per-table table, for people.
    pub fn text(&self) -> String {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let mut out = vec![
            format!(
                "plan: {} of {} MiB, expected DRAM hit ratio {:.1} %",
                grouped(&format!("{:.1}", mib(self.bytes()))),
                grouped(&format!("{:.1}", mib(self.budget))),
                100.0 * self.expected_hit_ratio()
            ),
            format!(
                "{:<12} {:>4} {:>11} {:>10} {:>6} {:>5} {:>10} {:>9} {:>8} {:>6}",
                "table",
                "type",
                "rows",
                "work set",
                "local",
                "whole",
                "hot rows",
                "cache MiB",
                "MiB",
                "hit %"
            ),
        ];
        for t in &self.tables {
            out.push(format!(
                "{:<12} {:>4} {:>11} {:>10} {:>6.2} {:>5} {:>10} {:>9.1} {:>8.1} {:>6.1}",
                t.table,
                t.kind,
                grouped(&t.rows.to_string()),
                grouped(&t.working_set.to_string()),
                t.locality,
                if t.resident { "yes" } else { "-" },
                grouped(&t.hot_rows.len().to_string()),
                mib(t.cache_bytes),
                mib(t.bytes()),
                100.0 * t.expected_hit_ratio
            ));
        }
        out.join("\n")
    }
}

/// A formatted non-negative number with its integer digits grouped by commas (Python's `,`).
fn grouped(number: &str) -> String {
    let (int, frac) = number.split_at(number.find('.').unwrap_or(number.len()));
    let mut out = String::with_capacity(number.len() + int.len() / 3);
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out + frac
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_working_set_and_locality() {
        assert_eq!(TableKind::of(10, 100, 0.5), TableKind::A);
        assert_eq!(TableKind::of(10, 100, 0.49), TableKind::B);
        assert_eq!(TableKind::of(11, 100, 0.2), TableKind::C);
        assert_eq!(TableKind::of(11, 100, 0.19), TableKind::D);
        assert_eq!(format!("{:>3}", TableKind::C), "  C");
    }

    #[test]
    fn digits_are_grouped_as_python_groups_them() {
        assert_eq!(grouped("0.0"), "0.0");
        assert_eq!(grouped("123"), "123");
        assert_eq!(grouped("1234"), "1,234");
        assert_eq!(grouped("1234567.5"), "1,234,567.5");
        assert_eq!(grouped("100000"), "100,000");
    }

    #[test]
    fn bytes_and_hit_ratio_add_up() {
        let t = |name: &str, resident, hot: Vec<u64>, cache, lookups, hit| TablePlan {
            table: name.into(),
            rows: 1_000,
            row_bytes: 64,
            table_bytes: 64_000,
            lookups,
            working_set: 10,
            locality: 0.5,
            kind: TableKind::A,
            resident,
            hot_rows: hot,
            cache_bytes: cache,
            expected_hit_ratio: hit,
            curve: Curve::default(),
        };
        let plan = Plan {
            budget: 100_000,
            tables: vec![
                t("whole", true, vec![], 0, 30, 1.0),
                t("part", false, vec![4, 2], 500, 10, 0.25),
            ],
            trace: String::new(),
            store: String::new(),
        };
        assert_eq!(plan.bytes(), 64_000 + 2 * (64 + HOT_ROW_OVERHEAD) + 500);
        assert_eq!(plan.expected_hit_ratio(), (30.0 + 2.5) / 40.0);
        let p = plan.placement();
        assert!(p.tables["whole"].resident);
        assert_eq!(p.tables["part"].hot_rows, vec![4, 2]);
        assert_eq!(p.tables["part"].cache_bytes, 500);
        let text = plan.text();
        assert!(text.starts_with("plan: 0.1 of 0.1 MiB, expected DRAM hit ratio 81.2 %"));
        assert!(text.contains("\nwhole           A       1,000         10   0.50   yes"));
    }
}
