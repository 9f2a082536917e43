//! What the verbs print, through [`outln!`], [`out!`], [`errln!`] and [`err!`] instead of
//! `println!` and its kin. A closed standard output or error (`| head`) is not the
//! verb's failure: what it would print there is discarded, and the verb does its work
//! and ends as it would have, with no panic ("failed printing to stdout") and no
//! message. Any other write error (a full disk) ends the process with a message and
//! exit status 1.

use std::fmt::Arguments;
use std::io::{self, Write};

/// Writes `args` to `out`, then a newline when `newline`.
pub fn write(mut out: impl Write, args: Arguments<'_>, newline: bool) {
    let written = out.write_fmt(args).and_then(|()| {
        if newline {
            out.write_all(b"\n")
        } else {
            out.flush()
        }
    });
    match written {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::BrokenPipe => {}
        Err(error) => {
            crate::telemetry::flush_logs();
            let _ = writeln!(io::stderr(), "Error: cannot write the output: {error}");
            std::process::exit(1);
        }
    }
}

/// `println!` for the verbs' results.
macro_rules! outln {
    () => {
        $crate::output::write(::std::io::stdout().lock(), format_args!(""), true)
    };
    ($($arg:tt)*) => {
        $crate::output::write(::std::io::stdout().lock(), format_args!($($arg)*), true)
    };
}

/// `print!` for the verbs' results.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write(::std::io::stdout().lock(), format_args!($($arg)*), false)
    };
}

/// `eprintln!` for the verbs' remarks.
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::output::write(::std::io::stderr().lock(), format_args!($($arg)*), true)
    };
}

/// `eprint!` for the verbs' questions.
macro_rules! err {
    ($($arg:tt)*) => {
        $crate::output::write(::std::io::stderr().lock(), format_args!($($arg)*), false)
    };
}

pub(crate) use {err, errln, out, outln};
