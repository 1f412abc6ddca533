//! `distopt train --finish-on-stdin`: the step a run ends at, told on standard input while it
//! trains (`finish N`), so that the processes of a run stop together at a step chosen while
//! they run.

use std::io::BufRead;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Steps between the `progress STEP` lines on stderr.
pub const PROGRESS_EVERY: u64 = 50;

/// The last step to train: at most `at_most` until a line `finish N` arrives on stdin (then N,
/// at most `at_most`); once stdin closes without one, the step reached.
pub struct Finish {
    at: Arc<AtomicU64>,
}

impl Finish {
    /// Starts reading stdin on a thread of its own.
    pub fn from_stdin(at_most: u64) -> Finish {
        let at = Arc::new(AtomicU64::new(at_most));
        let told = at.clone();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                let n = line.trim().strip_prefix("finish ").map(str::trim);
                if let Some(n) = n.and_then(|n| n.parse::<u64>().ok()) {
                    told.store(n.min(at_most), Ordering::SeqCst);
                    return;
                }
            }
            // Closed without a `finish` line: no step is left to train.
            told.store(0, Ordering::SeqCst);
        });
        Finish { at }
    }

    /// Whether to train another step after the `steps` done so far (writing `progress STEP`
    /// every [`PROGRESS_EVERY`] steps).
    pub fn more(&self, steps: u64) -> bool {
        if steps.is_multiple_of(PROGRESS_EVERY) {
            eprintln!("progress {steps}");
        }
        steps < self.at.load(Ordering::SeqCst)
    }
}
