//! Progress bars for the long parts of building a plan (compiling and measuring hundreds
//! of programs for a model's first call), drawn on standard error when it is a terminal.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// Below this many steps a plan is built in a moment: no bar.
const MIN_STEPS: usize = 64;

/// A bar counting `steps` of `what`, or `None` where it would not help (few steps, or
/// standard error is not a terminal).
pub(crate) fn bar(steps: usize, what: &'static str) -> Option<ProgressBar> {
    if steps < MIN_STEPS || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(steps as u64);
    if let Ok(style) = ProgressStyle::with_template("{msg} {bar:30} {pos}/{len} [{elapsed}]") {
        bar.set_style(style);
    }
    bar.set_message(what);
    Some(bar)
}
