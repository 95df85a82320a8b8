//! Progress bars for long work, drawn on stderr: in place on a terminal, and as one line a
//! second where stderr is a pipe or a file and bars were asked for (`--progress`).

use std::io::{self, IsTerminal, Write};
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle, TermLike};
use nearrec_format::ProgressFn;

/// A byte-counting bar of `total` bytes, or `None` when progress is off. Python turns progress
/// on by default only on a terminal, so a bar on anything else was asked for.
pub(crate) fn bar(enabled: bool, total: u64, label: &str) -> Option<ProgressBar> {
    if !enabled {
        return None;
    }
    let bar = ProgressBar::new(total).with_message(label.to_owned());
    if !io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::term_like_with_hz(Box::new(Lines), 1));
    }
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

/// stderr that is not a terminal: each drawing of the bar is a line of its own.
#[derive(Debug)]
struct Lines;

impl TermLike for Lines {
    fn width(&self) -> u16 {
        100
    }

    fn move_cursor_up(&self, _: usize) -> io::Result<()> {
        Ok(())
    }

    fn move_cursor_down(&self, _: usize) -> io::Result<()> {
        Ok(())
    }

    fn move_cursor_right(&self, _: usize) -> io::Result<()> {
        Ok(())
    }

    fn move_cursor_left(&self, _: usize) -> io::Result<()> {
        Ok(())
    }

    fn write_line(&self, s: &str) -> io::Result<()> {
        writeln!(io::stderr(), "{s}")
    }

    fn write_str(&self, s: &str) -> io::Result<()> {
        if s.trim().is_empty() {
            return Ok(());
        }
        writeln!(io::stderr(), "{s}")
    }

    fn clear_line(&self) -> io::Result<()> {
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        io::stderr().flush()
    }
}
