//! Shared helpers for integration tests: run the real `surge` binary in a temp
//! dir, find real client tools (failing loudly, naming the Debian package, when
//! one is missing), and run them with their output in the failure message.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const SURGE: &str = env!("CARGO_BIN_EXE_surge");

/// A port for a server a test starts (see `surge_bb::local::free_port`).
pub fn free_port() -> u16 {
    surge_bb::local::free_port().expect("a free TCP port")
}

/// Path of `tool`, or a panic that names the Debian package to install.
pub fn require(tool: &str, package: &str) -> PathBuf {
    for dir in ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"] {
        let p = Path::new(dir).join(tool);
        if p.is_file() {
            return p;
        }
    }
    panic!("{tool} is not installed: install the Debian package `{package}` (scripts/test-all.sh does: apt-get install {package})");
}

/// Run to completion; panic with the command's output unless it succeeds.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = run(cmd);
    assert!(out.status.success(), "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}", out.status, text(&out.stdout), text(&out.stderr));
    out
}

pub fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// nbdsh runs on the system python, where python3-libnbd installs its module
/// (a user's pyenv python would not have it).
pub fn nbdsh() -> Command {
    let nbdsh = require("nbdsh", "python3-libnbd");
    let mut c = Command::new(nbdsh);
    c.env("PATH", format!("/usr/bin:/bin:{}", std::env::var("PATH").unwrap_or_default()));
    c
}

pub fn sha256(path: &Path) -> String {
    let out = run_ok(Command::new("sha256sum").arg(path));
    text(&out.stdout).split_whitespace().next().unwrap().to_string()
}

/// `len` bytes of random data in a new file.
pub fn random_file(path: &Path, len: usize) {
    use std::io::Read;
    let mut buf = vec![0u8; len];
    std::fs::File::open("/dev/urandom").unwrap().read_exact(&mut buf).unwrap();
    std::fs::write(path, &buf).unwrap();
}

/// A running `surge serve`, killed when dropped.
pub struct Surge {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub sock: PathBuf,
    pub control: PathBuf,
    stdout: Arc<Mutex<String>>,
    log: PathBuf,
}

impl Surge {
    /// Serve with a unix socket, control socket and data dir in a fresh temp
    /// dir; `args` add exports and flags. Relative paths in specs land in the dir.
    pub fn start(args: &[&str]) -> Surge {
        let dir = tempfile::Builder::new().prefix("surge-test").tempdir().unwrap();
        let sock = dir.path().join("nbd.sock");
        let control = dir.path().join("control.sock");
        let mut cmd = Command::new(SURGE);
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(dir.path())
            .arg("--listen")
            .arg(format!("unix:{}", sock.display()))
            .arg("--control")
            .arg(&control)
            .args(args);
        Surge::spawn(cmd, dir, sock, control)
    }

    /// Run `cmd` (a full `surge serve` command line) and wait until it is ready.
    pub fn spawn(mut cmd: Command, dir: tempfile::TempDir, sock: PathBuf, control: PathBuf) -> Surge {
        let log = dir.path().join("surge.log");
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(std::fs::File::create(&log).unwrap());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {SURGE}: {e}"));
        let stdout = Arc::new(Mutex::new(String::new()));
        let out = child.stdout.take().unwrap();
        let sink = stdout.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        let mut s = Surge { child: Some(child), dir, sock, control, stdout, log };
        s.wait_ready();
        s
    }

    /// Ready = the connection instructions are printed (after every listener and
    /// the control socket are up).
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if self.stdout().contains("Connect with:") {
                assert!(UnixStream::connect(&self.sock).is_ok(), "printed instructions before listening");
                return;
            }
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("surge serve exited early ({st}):\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("surge serve not ready after 30 s:\n{}", self.logs());
    }

    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.sock.display())
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(self.pid(), sig) }, 0);
    }

    /// Wait for exit (bounded); panics if it does not exit in time.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut().unwrap();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st;
            }
            assert!(Instant::now() < deadline, "surge serve did not exit within {timeout:?}:\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `surge <args> --control <this server's socket>`.
    pub fn client(&self, args: &[&str]) -> Output {
        run(Command::new(SURGE).args(args).arg("--control").arg(&self.control))
    }
}

impl Drop for Surge {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
