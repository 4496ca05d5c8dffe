//! A local `redis-server` for a one-machine setup (and tests): append-only
//! file with fsync on every write, so a restarted server loses no committed
//! metadata.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum LocalRedisError {
    #[error("starting redis-server (is the redis-server package installed?): {0}")]
    Spawn(std::io::Error),
    #[error("redis-server on port {port} did not accept connections within 10 s (log: {log})")]
    NotReady { port: u16, log: String },
}

pub struct LocalRedis {
    pub port: u16,
    pub dir: PathBuf,
    child: Option<Child>,
}

impl LocalRedis {
    /// Starts redis-server on 127.0.0.1:`port` keeping its files in `dir`.
    pub fn start(dir: &Path, port: u16) -> Result<LocalRedis, LocalRedisError> {
        std::fs::create_dir_all(dir).map_err(LocalRedisError::Spawn)?;
        let mut r = LocalRedis { port, dir: dir.to_path_buf(), child: None };
        r.spawn()?;
        Ok(r)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn spawn(&mut self) -> Result<(), LocalRedisError> {
        let log = self.dir.join("redis.log");
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string(), "--appendonly", "yes", "--appendfsync", "always"])
            .args(["--save", "", "--protected-mode", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(LocalRedisError::Spawn)?;
        self.child = Some(child);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                use std::io::{Read, Write};
                let mut buf = [0u8; 64];
                if s.write_all(b"PING\r\n").is_ok() && s.read(&mut buf).is_ok_and(|n| buf[..n].starts_with(b"+PONG")) {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(LocalRedisError::NotReady { port: self.port, log: log.display().to_string() })
    }

    /// Kills the server (SIGKILL: no chance to save anything more).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills and starts it again on the same port and files.
    pub fn restart(&mut self) -> Result<(), LocalRedisError> {
        self.kill();
        self.spawn()
    }

    /// Waits for the server process (foreground use by `surge bb redis`).
    pub fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        match self.child.as_mut() {
            Some(c) => c.wait(),
            None => Err(std::io::Error::other("redis-server not running")),
        }
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        self.kill();
    }
}
