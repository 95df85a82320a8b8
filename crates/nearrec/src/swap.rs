//! What a swap checks before it serves a new store under the old one's name
//! ([`crate::Store::swap`]): that every request the old one answers, the new one answers too.
//! Each table served now must be in the new store with the same dim and dtype and at least its
//! rows, and a model kept with the old store must be kept with the new one, taking the same
//! inputs and dense features and giving as many outputs. A difference is refused as
//! [`Error::InvalidRequest`] naming the table, unless the caller forces the swap.

use nearrec_format::{StoreReader, TableMeta};

use crate::error::{Error, Result};
use crate::model::StoredModel;

/// Refuses a swap from the tables `old` and model `old_model` (where the old store keeps one)
/// to the store `new` opened, at the first difference.
pub(crate) fn check(
    old: &[TableMeta],
    old_model: Option<&StoredModel>,
    new: &StoreReader,
) -> Result<()> {
    let refuse = |table: &str, what: String| Error::InvalidRequest {
        table: Some(table.to_owned()),
        position: None,
        reason: format!(
            "the store at {} cannot replace the one served: {what}; every request the served \
             store answers would fail on it. Swap with force to serve it anyway",
            new.path().display()
        ),
    };
    for t in old {
        let Some(n) = new.tables().iter().find(|n| n.name == t.name) else {
            return Err(refuse(&t.name, format!("it has no table {:?}", t.name)));
        };
        if n.dim != t.dim {
            let what = format!("table {:?} has dim {}, not {}", t.name, n.dim, t.dim);
            return Err(refuse(&t.name, what));
        }
        if n.dtype != t.dtype {
            let (was, is) = (t.dtype.name(), n.dtype.name());
            let what = format!("table {:?} holds {is} rows, not {was}", t.name);
            return Err(refuse(&t.name, what));
        }
        if n.rows < t.rows {
            let what = format!(
                "table {:?} has {} rows, fewer than {}",
                t.name, n.rows, t.rows
            );
            return Err(refuse(&t.name, what));
        }
    }
    let Some(model) = old_model else {
        return Ok(());
    };
    let first = model.tables.first().map_or("", String::as_str);
    let next = StoredModel::load(new).map_err(|e| {
        refuse(
            first,
            format!("the served store keeps a model and it keeps none usable ({e})"),
        )
    })?;
    if next.inputs != model.inputs {
        let what = format!(
            "its model takes the inputs {:?}, not {:?}",
            next.inputs, model.inputs
        );
        return Err(refuse(first, what));
    }
    let (dense, outputs) = (model.dense.dense_width(), model.dense.outputs());
    if next.dense.dense_width() != dense || next.dense.outputs() != outputs {
        let what = format!(
            "its model takes {} dense features and gives {} outputs, not {dense} and {outputs}",
            next.dense.dense_width(),
            next.dense.outputs()
        );
        return Err(refuse(first, what));
    }
    Ok(())
}
