//! Progress bars for long work, drawn on stderr (hidden when stderr is not a terminal).

use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};
use nearrec_format::ProgressFn;

/// A byte-counting bar of `total` bytes, or `None` when progress is off.
pub(crate) fn bar(enabled: bool, total: u64, label: &str) -> Option<ProgressBar> {
    if !enabled {
        return None;
    }
    let bar = ProgressBar::new(total).with_message(label.to_owned());
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:12} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    Some(bar)
}

pub(crate) fn callback(bar: &Option<ProgressBar>) -> Option<ProgressFn> {
    bar.clone()
        .map(|b| Arc::new(move |n: u64| b.inc(n)) as ProgressFn)
}
