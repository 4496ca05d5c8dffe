//! A fixed pool of threads running queued jobs in arrival order.
//!
//! A crossbeam channel hands the jobs over. Its receivers spin briefly before
//! they sleep, which costs CPU but often catches the next request of a serial
//! stream (a `stat` loop) without a wake-up. A pool on a mutex and condition
//! variable was tried, in a build with the one-round-trip metadata calls,
//! against the build before them (`scripts/bench/bb-meta.sh`, 3 rounds,
//! medians): its mdtest stat rate was lower (965 vs 1390/s), while the same
//! metadata calls on this channel had raised it (1307 vs 1156/s, another run).
//! The two builds were never compared head to head, so the channel stays.

use crossbeam_channel::{unbounded, Sender};

pub type Job = Box<dyn FnOnce() + Send>;

/// The pool; dropping it lets the workers finish the queued jobs and exit.
pub struct Workers {
    jobs: Sender<Job>,
}

impl Workers {
    /// Starts `n` (at least one) threads named `{name}-{i}`.
    pub fn start(name: &str, n: usize) -> std::io::Result<Workers> {
        let (jobs, rx) = unbounded::<Job>();
        for i in 0..n.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new().name(format!("{name}-{i}")).spawn(move || {
                for job in rx {
                    // A job that panics (a bug; the panic hook has printed
                    // it) must not take its worker with it: the jobs queued
                    // behind it would never run.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                }
            })?;
        }
        Ok(Workers { jobs })
    }

    /// Queues `job` for the next idle worker.
    pub fn run(&self, job: impl FnOnce() + Send + 'static) {
        // Fails only once every worker has exited, which they do only after
        // the pool (this sender) is dropped.
        let _ = self.jobs.send(Box::new(job));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn every_job_runs_once_even_when_the_pool_is_dropped_with_jobs_queued() {
        let done = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let w = Workers::start("t", 3).unwrap();
            for _ in 0..1000 {
                let (done, tx) = (done.clone(), tx.clone());
                w.run(move || {
                    done.fetch_add(1, Ordering::SeqCst);
                    tx.send(()).unwrap();
                });
            }
        }
        drop(tx);
        // The channel ends once every job (each holding a sender) has run and
        // every worker has exited, dropping the jobs' senders.
        assert_eq!(rx.iter().count(), 1000);
        assert_eq!(done.load(Ordering::SeqCst), 1000);
    }

    #[test]
    fn a_panicking_job_leaves_its_worker_running() {
        let w = Workers::start("t", 1).unwrap();
        w.run(|| panic!("a bug in a job"));
        let (tx, rx) = std::sync::mpsc::channel();
        w.run(move || tx.send(7).unwrap());
        assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(10)), Ok(7));
    }

    #[test]
    fn a_slow_job_does_not_hold_up_the_others() {
        let w = Workers::start("t", 2).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        w.run(move || release_rx.recv().unwrap());
        for i in 0..10 {
            let tx = tx.clone();
            w.run(move || tx.send(i).unwrap());
        }
        let got: Vec<i32> = (0..10).map(|_| rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap()).collect();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        release_tx.send(()).unwrap();
    }
}
