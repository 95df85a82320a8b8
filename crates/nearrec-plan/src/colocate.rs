//! Row co-location (after Bandana): an order for a table's rows, from a trace, that puts rows read
//! together in the same blocks, so one block read serves several lookups of a batch. The format
//! layer stores the order beside the table; lookups keep their row ids.

use std::str::FromStr;

use crate::error::{PlanError, Result};

/// How rows are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Colocation {
    /// Most-read rows first (ties by first use): under independent draws, rows of similar
    /// popularity share blocks, which maximises the chance that a batch's misses do.
    Frequency,
    /// In the order the trace first reads them: rows first read in the same bags and batches
    /// share blocks, which follows co-access that is bursty in time (stack-distance traces).
    FirstTouch,
}

impl Colocation {
    pub const ALL: [Self; 2] = [Self::Frequency, Self::FirstTouch];

    pub fn name(self) -> &'static str {
        match self {
            Self::Frequency => "frequency",
            Self::FirstTouch => "first_touch",
        }
    }
}

impl FromStr for Colocation {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| format!("unknown co-location {s:?}; expected frequency or first_touch"))
    }
}

/// The rows of a `rows`-row table in slot order (entry `s` is the row stored at slot `s`): the
/// rows `indices` reads, ordered as `how` says, then the rows it never reads, in id order.
/// Negative or out-of-range ids are an error naming their position.
pub fn colocate(table: &str, rows: u64, indices: &[i64], how: Colocation) -> Result<Vec<u32>> {
    if rows > u64::from(u32::MAX) {
        return Err(PlanError::BadSpec {
            table: table.to_owned(),
            reason: format!(
                "{rows} rows: co-location supports at most {} rows",
                u32::MAX
            ),
        });
    }
    // per row: (reads, first read position + 1); 0 reads = never read
    let mut seen = vec![(0u32, 0u64); rows as usize];
    for (position, &id) in indices.iter().enumerate() {
        let entry = u64::try_from(id)
            .ok()
            .and_then(|r| seen.get_mut(r as usize))
            .ok_or_else(|| PlanError::BadSpec {
                table: table.to_owned(),
                reason: format!("index {id} at position {position} is outside 0..{rows}"),
            })?;
        if entry.0 == 0 {
            entry.1 = position as u64;
        }
        entry.0 = entry.0.saturating_add(1);
    }
    let mut read: Vec<u32> = (0..rows as u32)
        .filter(|&r| seen[r as usize].0 > 0)
        .collect();
    match how {
        Colocation::Frequency => {
            read.sort_unstable_by_key(|&r| (u32::MAX - seen[r as usize].0, seen[r as usize].1));
        }
        Colocation::FirstTouch => read.sort_unstable_by_key(|&r| seen[r as usize].1),
    }
    read.extend((0..rows as u32).filter(|&r| seen[r as usize].0 == 0));
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders() {
        let trace = [5, 2, 5, 7, 2, 5];
        assert_eq!(
            colocate("t", 8, &trace, Colocation::Frequency).unwrap(),
            vec![5, 2, 7, 0, 1, 3, 4, 6]
        );
        assert_eq!(
            colocate("t", 8, &trace, Colocation::FirstTouch).unwrap(),
            vec![5, 2, 7, 0, 1, 3, 4, 6]
        );
        let trace = [3, 1, 1, 0, 0, 0];
        assert_eq!(
            colocate("t", 4, &trace, Colocation::Frequency).unwrap(),
            vec![0, 1, 3, 2]
        );
        assert_eq!(
            colocate("t", 4, &trace, Colocation::FirstTouch).unwrap(),
            vec![3, 1, 0, 2]
        );
        assert_eq!(
            colocate("t", 3, &[], Colocation::Frequency).unwrap(),
            vec![0, 1, 2]
        );
        let err = colocate("t", 4, &[1, 4], Colocation::Frequency).unwrap_err();
        assert!(err.to_string().contains("position 1"), "{err}");
        assert!(colocate("t", 4, &[-1], Colocation::FirstTouch).is_err());
        assert_eq!("first_touch".parse(), Ok(Colocation::FirstTouch));
        assert!("x".parse::<Colocation>().is_err());
    }
}
