//! Progress of a running experiment: an indicatif bar (elapsed time, steps,
//! ETA once the number of steps is known) on a terminal, plain lines
//! otherwise. Experiments call [`step`]; `surge experiment` starts and ends it.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use parking_lot::Mutex;
use std::io::IsTerminal;
use std::time::Duration;

static BAR: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// Show progress on stderr if it is a terminal (else [`step`] prints lines).
pub fn start(name: &str) {
    if !std::io::stderr().is_terminal() {
        return;
    }
    let pb = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    pb.set_style(ProgressStyle::with_template("{spinner} {prefix} [{elapsed_precise}] {wide_msg}").expect("static template"));
    pb.set_prefix(name.to_string());
    pb.enable_steady_tick(Duration::from_millis(200));
    *BAR.lock() = Some(pb);
}

/// The experiment has `n` steps: show a bar with an ETA.
pub fn set_steps(n: u64) {
    if let Some(pb) = BAR.lock().as_ref() {
        pb.set_length(n);
        pb.set_style(
            ProgressStyle::with_template("{prefix} [{elapsed_precise}] {bar:30} {pos}/{len} ETA {eta} {wide_msg}").expect("static template"),
        );
    }
}

/// What is running now (`done`: one more step finished).
pub fn step(msg: impl Into<String>, done: bool) {
    let msg = msg.into();
    match BAR.lock().as_ref() {
        Some(pb) => {
            if done {
                pb.inc(1);
            }
            pb.set_message(msg);
        }
        None => eprintln!("{msg}"),
    }
}

/// Remove the bar before the experiment prints its table.
pub fn finish() {
    if let Some(pb) = BAR.lock().take() {
        pb.finish_and_clear();
    }
}
