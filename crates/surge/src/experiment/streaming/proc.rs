//! Running the real programs of the experiment: commands that must succeed,
//! long-running servers that are stopped (by pid) when dropped.

use anyhow::{bail, Context as _};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Run to completion; the error carries the command and its stderr.
pub fn sh(cmd: &mut Command) -> anyhow::Result<Output> {
    let out = cmd.stdin(Stdio::null()).output().with_context(|| format!("cannot run {cmd:?} (is it installed? scripts/test-all.sh installs it)"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed ({}): {}{}", out.status, String::from_utf8_lossy(&out.stderr).trim(), String::from_utf8_lossy(&out.stdout).trim());
    }
    Ok(out)
}

/// `sh -c SCRIPT`.
pub fn shell(script: &str) -> anyhow::Result<Output> {
    sh(Command::new("sh").arg("-c").arg(script))
}

/// Poll `ready` until it holds or `timeout` passes.
pub fn wait_until(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !ready() {
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// A server process; SIGTERM, then SIGKILL, when dropped.
pub struct Proc {
    name: String,
    child: Option<Child>,
    log: std::path::PathBuf,
}

impl Proc {
    /// Start `cmd` with its output in `log`.
    pub fn spawn(name: &str, cmd: &mut Command, log: &Path) -> anyhow::Result<Proc> {
        let f = std::fs::File::create(log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()
            .with_context(|| format!("cannot start {name}: {cmd:?} (is it installed? scripts/test-all.sh installs it)"))?;
        Ok(Proc { name: name.to_string(), child: Some(child), log: log.to_path_buf() })
    }

    /// Fail with the log if the process has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(c) = self.child.as_mut() {
            if let Some(st) = c.try_wait()? {
                bail!("{} exited early ({st}): {}", self.name, std::fs::read_to_string(&self.log).unwrap_or_default().trim());
            }
        }
        Ok(())
    }

    /// Wait until `path` exists (a socket, a FUSE file), failing early if the process dies.
    pub fn wait_for_path(&mut self, path: &Path, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while !path.exists() {
            self.check_alive()?;
            if Instant::now() > deadline {
                bail!("{} did not create {} within {timeout:?}", self.name, path.display());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// The process id (while running).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// CPU seconds (user + system, every thread) the process has used so far.
    pub fn cpu_s(&self) -> Option<f64> {
        cpu_s_of(self.pid()?)
    }

    /// SIGKILL now (a crash, not a shutdown) and reap it.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stop gracefully (SIGTERM), waiting up to `timeout`, then SIGKILL.
    pub fn stop(&mut self, timeout: Duration) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + timeout;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

/// CPU seconds (user + system, every thread) process `pid` has used: its
/// CPU-time clock (nanoseconds: a 1 s pattern's few hundred ms are not
/// measured in 10 ms ticks), else /proc/PID/stat.
pub fn cpu_s_of(pid: u32) -> Option<f64> {
    cpu_clock_s(pid).or_else(|| cpu_s_from_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?))
}

fn cpu_clock_s(pid: u32) -> Option<f64> {
    let mut clock: libc::clockid_t = 0;
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: both pointers are to live locals of the right types.
    let ok = unsafe { libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) == 0 && libc::clock_gettime(clock, &mut ts) == 0 };
    ok.then(|| ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
}

fn cpu_s_from_stat(stat: &str) -> Option<f64> {
    // The command name (field 2) may hold spaces and parentheses: the fields
    // counted from the last ')' on are state (3), ..., utime (14), stime (15).
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks / hz)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_time_is_read_after_a_command_name_with_spaces_and_parentheses() {
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 1000 0 0";
        assert_eq!(super::cpu_s_from_stat(stat), Some(300.0 / hz));
        assert!(super::cpu_s_of(std::process::id()).is_some());
        assert_eq!(super::cpu_s_from_stat("garbage"), None);
    }

    #[test]
    fn another_process_cpu_clock_counts_its_work_finer_than_ticks() {
        // A child that spins for about 0.3 s of CPU, then sleeps.
        let mut child = std::process::Command::new("sh").arg("-c").arg("i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 5").spawn().unwrap();
        let pid = child.id();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let a = super::cpu_clock_s(pid).expect("the CPU clock of a child");
        std::thread::sleep(std::time::Duration::from_millis(2500));
        let b = super::cpu_clock_s(pid).unwrap();
        let stat = super::cpu_s_from_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap()).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert!(b > a, "the spin used CPU: {a} then {b}");
        // The clock and /proc agree to within a few ticks; the clock is not rounded to them.
        assert!((b - stat).abs() < 0.05, "clock {b} s, /proc {stat} s");
        assert!(b.fract() * 100.0 % 1.0 != 0.0 || a.fract() * 100.0 % 1.0 != 0.0, "nanoseconds, not 10 ms ticks: {a} {b}");
        let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max").unwrap().trim().parse().unwrap();
        assert_eq!(super::cpu_clock_s(pid_max + 1), None, "no such process");
    }
}
