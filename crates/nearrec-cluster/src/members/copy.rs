//! What a catch-up copies: the rows of a shard's tables that differ between a member and the
//! replica catching up, compared by digest where they are — a keyed table's by key — each call
//! adopted by the replica as a write of its own.

use nearrec::{Replica as _, RowWrite, StoreApi, WriteOptions};
use nearrec_client::Client;

use crate::shard::Replica;

/// Rows of one table a catch-up compares per call, and the values it copies per call at most.
const DIGEST_ROWS: u64 = 1 << 16;
const COPY_VALUES: usize = 2 << 20;

/// Copies the rows of every table of the shard that differ between `source` and `target` to
/// `target`, each call adopted as its next write; the rows copied, and `target`'s count of
/// writes after. A keyed table is compared by key (each replica's keys have rows of its own):
/// the keys `target` holds and `source` does not are removed first, then the keys whose rows
/// differ or that `target` lacks are written.
pub(super) fn copy_differing(source: &Replica, target: &Replica) -> nearrec::Result<(u64, u64)> {
    let (from, to) = (&source.client, &target.client);
    let mut copy = Copy {
        to,
        copied: 0,
        version: to.version()?,
    };
    for table in from.info()?.tables {
        let (name, rows) = (&table.name, table.rows);
        if table.keys.is_some() {
            let (differ, gone) = differing_keys(from, to, name)?;
            copy.adopt(name, &gone, None)?;
            copy.rows(from, name, table.dim as usize, &differ)?;
            continue;
        }
        let mut ids: Vec<i64> = Vec::new();
        let mut first = 0;
        while first < rows {
            let n = DIGEST_ROWS.min(rows - first);
            let (a, b) = (
                from.row_digests(name, first, n)?,
                to.row_digests(name, first, n)?,
            );
            ids.extend(
                (a.iter().zip(&b).enumerate())
                    .filter(|(_, (x, y))| x != y)
                    .map(|(k, _)| (first + k as u64) as i64),
            );
            first += n;
        }
        copy.rows(from, name, table.dim as usize, &ids)?;
    }
    Ok((copy.copied, copy.version))
}

/// A catch-up's calls to the replica it copies to, each adopted as its next write.
struct Copy<'a> {
    to: &'a Client,
    copied: u64,
    version: u64,
}

impl Copy<'_> {
    /// Rows (or keys) `ids` of `table` read from `from` and written.
    fn rows(&mut self, from: &Client, table: &str, dim: usize, ids: &[i64]) -> nearrec::Result<()> {
        for chunk in ids.chunks((COPY_VALUES / dim.max(1)).max(1)) {
            let mut values = vec![0f32; chunk.len() * dim];
            from.read_rows(table, chunk, &mut values)?;
            self.adopt(table, chunk, Some(&values))?;
        }
        Ok(())
    }

    /// `ids` of `table` written with `values`, or removed (`None`), as the next write.
    fn adopt(&mut self, table: &str, ids: &[i64], values: Option<&[f32]>) -> nearrec::Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let w = RowWrite {
            table,
            ids,
            values: values.map(nearrec::RowValues::F32),
        };
        let options = WriteOptions {
            allow_nonfinite: true,
        };
        self.version = self.to.adopt(&[w], options, self.version + 1)?;
        self.copied += ids.len() as u64;
        Ok(())
    }
}

/// Keyed table `table`'s keys to copy from `from` to `to` — those whose rows differ, or that
/// only `from` holds — and those to remove from `to`, which only it holds.
fn differing_keys(
    from: &Client,
    to: &Client,
    table: &str,
) -> nearrec::Result<(Vec<i64>, Vec<i64>)> {
    let (a, b) = (all_key_digests(from, table)?, all_key_digests(to, table)?);
    let (mut differ, mut gone) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        match (a.get(i), b.get(j)) {
            (Some(&(x, dx)), Some(&(y, dy))) if x == y => {
                if dx != dy {
                    differ.push(x as i64);
                }
                (i, j) = (i + 1, j + 1);
            }
            (Some(&(x, _)), Some(&(y, _))) if y < x => {
                gone.push(y as i64);
                j += 1;
            }
            (Some(&(x, _)), _) => {
                differ.push(x as i64);
                i += 1;
            }
            (None, Some(&(y, _))) => {
                gone.push(y as i64);
                j += 1;
            }
            (None, None) => break,
        }
    }
    Ok((differ, gone))
}

/// Every key of keyed table `table` on `replica`, in order, with its row's digest.
fn all_key_digests(replica: &Client, table: &str) -> nearrec::Result<Vec<(u64, u64)>> {
    let mut all: Vec<(u64, u64)> = Vec::new();
    loop {
        let after = all.last().map(|&(key, _)| key);
        let page = replica.key_digests(table, after, DIGEST_ROWS)?;
        let last = (page.len() as u64) < DIGEST_ROWS;
        all.extend(page);
        if last {
            return Ok(all);
        }
    }
}
