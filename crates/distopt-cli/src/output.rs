//! The command's standard output. `println!` panics when stdout is gone (`distopt train … |
//! head` closes the pipe while the report is written); [`outln!`] and [`out!`] write the same
//! text, and a reader that went away ends the process quietly with status 0 (as
//! ripgrep does), while any other write error is reported on stderr with status 1. The signal
//! SIGPIPE stays ignored (Rust's default): a rank's socket to a peer that died must be an
//! error the rank can survive, never a signal that kills it.

use std::fmt::Arguments;
use std::io::{ErrorKind, Write};

/// Writes `args` to stdout and flushes, or ends the process (see the module's doc).
pub fn write(args: Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    if let Err(err) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        if err.kind() == ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("distopt: cannot write to standard output: {err}");
        std::process::exit(1);
    }
}

/// `print!` whose failure ends the process cleanly (see [`write`]).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write(format_args!($($arg)*))
    };
}

/// `println!` whose failure ends the process cleanly (see [`write`]).
macro_rules! outln {
    () => {
        $crate::output::write(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}

pub(crate) use {out, outln};
