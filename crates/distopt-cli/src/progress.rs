//! Progress bars (indicatif) on stderr, drawn only when stderr is a terminal: piped or
//! redirected output (tests, `--json` into a file, CI logs) never sees them.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar of `total` steps labelled `label`, with the rate and the time left; hidden when
/// stderr is not a terminal or `enabled` is false (for example every MPI rank but the first).
pub fn bar(label: &str, total: u64, unit: &str, enabled: bool) -> ProgressBar {
    let target = if enabled && std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(Some(total), target);
    let template = format!(
        "{{prefix:<12}} [{{bar:30}}] {{pos}}/{{len}} {unit} {{per_sec}} ETA {{eta}} {{msg}}"
    );
    bar.set_style(
        ProgressStyle::with_template(&template)
            .expect("a valid progress template")
            .progress_chars("#>."),
    );
    bar.set_prefix(label.to_string());
    bar
}
