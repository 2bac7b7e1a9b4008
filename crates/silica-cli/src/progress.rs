//! A progress line on stderr for long batch jobs.

use std::io::{self, IsTerminal, Write};
use std::time::Instant;

/// A counter line on stderr for inputs of more than one batch: rewritten in
/// place on a terminal, else one line per tenth.
pub struct Progress {
    verb: &'static str,
    noun: &'static str,
    active: bool,
    terminal: bool,
    last_tenth: usize,
    start: Instant,
}

impl Progress {
    pub fn new(
        total: usize,
        batch_size: usize,
        verb: &'static str,
        noun: &'static str,
    ) -> Progress {
        Progress {
            verb,
            noun,
            active: total > batch_size,
            terminal: io::stderr().is_terminal(),
            last_tenth: 0,
            start: Instant::now(),
        }
    }

    pub fn update(&mut self, done: usize, total: usize) {
        if !self.active {
            return;
        }
        let rate = done as f64 / self.start.elapsed().as_secs_f64().max(1e-9);
        let line = format!("{} {done}/{total} {} ({rate:.0}/s)", self.verb, self.noun);
        if self.terminal {
            eprint!("\r{line}");
        } else {
            let tenth = done * 10 / total.max(1);
            if tenth > self.last_tenth || done == total {
                self.last_tenth = tenth;
                eprintln!("{line}");
            }
        }
        let _ = io::stderr().flush();
    }

    pub fn finish(&self) {
        if self.active && self.terminal {
            eprintln!();
        }
    }
}
