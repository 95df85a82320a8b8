//! Copying a store with its rows in new orders (row co-location, see [`RowOrder`]).

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;

use crate::chunks::ProgressFn;
use crate::error::{FormatError, Result};
use crate::layout::DATA_OFFSET;
use crate::manifest::Manifest;
use crate::order::RowOrder;
use crate::reader::StoreReader;
use crate::writer::{StoreOptions, StoreWriter, TableSpec};

/// Writes a copy of `src` at `dst` in which table `i`'s rows sit as `orders[i]` says (`None`: as
/// they sit in `src`; the identity order: in row-id order, stored without an order file). Row
/// ids, values, attachments and everything else stay as they were. The source's data is
/// checked against its checksums first, so a damaged table is never copied under a fresh one;
/// the copy appears atomically, like any store.
pub fn copy_ordered(
    src: &StoreReader,
    dst: impl AsRef<Path>,
    orders: &[Option<RowOrder>],
    options: StoreOptions,
    progress: Option<ProgressFn>,
) -> Result<Manifest> {
    let tables = src.tables();
    if orders.len() != tables.len() {
        return Err(FormatError::invalid_table(
            "-",
            format!(
                "{} row orders given for a store of {} tables",
                orders.len(),
                tables.len()
            ),
        ));
    }
    for (meta, order) in tables.iter().zip(orders) {
        if let Some(o) = order.as_ref().filter(|o| o.rows() != meta.rows) {
            return Err(FormatError::invalid_table(
                &meta.name,
                format!(
                    "the row order has {} rows, the table {}",
                    o.rows(),
                    meta.rows
                ),
            ));
        }
    }
    if let Some(bad) = src.verify(None).into_iter().find_map(|c| c.error) {
        return Err(FormatError::corrupted(src.path(), bad));
    }
    let mut writer = StoreWriter::create(dst, options)?;
    if let Some(p) = progress {
        writer = writer.with_progress(p);
    }
    for (i, (meta, order)) in tables.iter().zip(orders).enumerate() {
        let mut table = writer.table(TableSpec {
            name: meta.name.clone(),
            rows: meta.rows,
            dim: meta.dim,
            dtype: meta.dtype,
            block_bytes: meta.block_bytes,
        })?;
        // the order the copy gets: the one given, else the source's; none for the identity
        let order = match order {
            Some(o) => Some(o),
            None => src.order(i).map(|o| o.as_ref()),
        }
        .filter(|o| !o.is_identity());
        let rows_by_slot = order.map(RowOrder::rows_by_slot);
        let (layout, file, was) = (meta.layout(), src.file(i), src.order(i));
        let failed = Mutex::new(None);
        table.write_rows(meta.rows, |slot, out, _| {
            let row = rows_by_slot
                .as_ref()
                .map_or(slot, |r| u64::from(r[slot as usize]));
            let at = DATA_OFFSET + layout.row_offset(was.map_or(row, |o| o.slot(row)));
            if let Err(e) = file.read_exact_at(out, at) {
                failed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert(e);
            }
            Default::default()
        })?;
        table.keep_error(meta.quant_error);
        if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(FormatError::io(src.path().join(&meta.file), e));
        }
        match (order, src.keys(i)?) {
            (Some(_), Some(_)) => {
                return Err(FormatError::invalid_table(
                    &meta.name,
                    "a keyed table cannot be co-located (its rows are found by key)",
                ));
            }
            (Some(o), None) => writer.finish_table_ordered(table, o)?,
            // every row was copied as it is: the keys keep their rows
            (None, Some(keys)) => writer.finish_keyed(table, &keys)?,
            (None, None) => writer.finish_table(table)?,
        }
    }
    for a in src.attachments() {
        let bytes = src
            .read_attachment(&a.name)?
            .expect("listed in the manifest");
        writer.attach(&a.name, &bytes)?;
    }
    writer.commit()
}
