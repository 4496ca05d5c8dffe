//! The one local S3 server every file system uses (moto in server mode, as
//! CI uses), and the S3 requests each file system made, counted from its
//! request log (one line per request, each file system has its own bucket).

use super::machines::{self, Machines};
use crate::experiment::streaming::proc::{self, Proc};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub struct S3Server {
    pub endpoint: String,
    log: PathBuf,
    _proc: Proc,
}

/// Requests to one bucket, by S3's price classes.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Requests {
    /// PUT, COPY, POST, LIST (priced per 1,000 as "PUT, COPY, POST, LIST").
    pub put_class: u64,
    /// GET, HEAD and the rest (priced per 1,000 as "GET, SELECT and all other").
    pub get_class: u64,
}

impl S3Server {
    pub const KEY: &'static str = "test";
    pub const SECRET: &'static str = "test";

    /// moto on the S3 machine (its address, port 5000), or on loopback.
    pub fn start(dir: &Path, machines: &Machines) -> anyhow::Result<S3Server> {
        let log = dir.join("moto.log");
        let ip = machines.ip(machines::S3);
        let port = if machines.topology().is_some() { 5000 } else { surge_bb::local::free_port()? };
        let mut cmd = machines.command(machines::S3, "moto_server");
        cmd.args(["-H", &ip, "-p", &port.to_string()]);
        let mut p = Proc::spawn("moto_server", &mut cmd, &log)?;
        proc::wait_until("moto_server", Duration::from_secs(30), || p.check_alive().is_ok() && std::net::TcpStream::connect((ip.as_str(), port)).is_ok())?;
        p.check_alive()?;
        Ok(S3Server { endpoint: format!("http://{ip}:{port}"), log, _proc: p })
    }

    /// Environment for surge and boto3 clients.
    pub fn client_env(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID".into(), Self::KEY.into()),
            ("AWS_SECRET_ACCESS_KEY".into(), Self::SECRET.into()),
            ("AWS_REGION".into(), "us-east-1".into()),
            ("AWS_DEFAULT_REGION".into(), "us-east-1".into()),
            ("SURGE_BB_S3_ENDPOINT".into(), self.endpoint.clone()),
        ]
    }

    /// Create `bucket` if missing (moto accepts unsigned requests).
    pub fn create_bucket(&self, bucket: &str) -> anyhow::Result<()> {
        use std::io::{Read, Write};
        let hostport = self.endpoint.trim_start_matches("http://");
        let mut s = std::net::TcpStream::connect(hostport)?;
        write!(s, "PUT /{bucket} HTTP/1.1\r\nHost: {hostport}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
        let mut resp = String::new();
        s.read_to_string(&mut resp)?;
        anyhow::ensure!(resp.starts_with("HTTP/1.1 200"), "creating bucket {bucket}: {}", resp.lines().next().unwrap_or(""));
        Ok(())
    }

    /// Requests made to `bucket` so far.
    pub fn requests(&self, bucket: &str) -> Requests {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        count_requests(&log, bucket)
    }
}

/// Count `"METHOD /bucket..."` request lines of a werkzeug access log.
pub fn count_requests(log: &str, bucket: &str) -> Requests {
    let mut r = Requests::default();
    for line in log.lines() {
        let Some(req) = line.split('"').nth(1) else { continue };
        let mut parts = req.split(' ');
        let (Some(method), Some(target)) = (parts.next(), parts.next()) else { continue };
        let path = target.split('?').next().unwrap_or("");
        let b = path.trim_start_matches('/').split('/').next().unwrap_or("");
        if b != bucket {
            continue;
        }
        let list = method == "GET" && (path.trim_end_matches('/') == format!("/{bucket}"));
        match method {
            "PUT" | "POST" => r.put_class += 1,
            "GET" if list => r.put_class += 1,
            _ => r.get_class += 1,
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_bucket_and_price_class() {
        let log = r#"127.0.0.1 - - [25/Nov/2026 20:03:40] "PUT /jfs/bbjfs/chunks/0/0/203_13_4194304?x-id=PutObject HTTP/1.1" 200 -
127.0.0.1 - - [25/Nov/2026 20:03:40] "GET /jfs/bbjfs/x?x-id=GetObject HTTP/1.1" 200 -
127.0.0.1 - - [25/Nov/2026 20:03:40] "GET /jfs?list-type=2&prefix=a HTTP/1.1" 200 -
127.0.0.1 - - [25/Nov/2026 20:03:40] "HEAD /jfs/a HTTP/1.1" 200 -
127.0.0.1 - - [25/Nov/2026 20:03:40] "PUT /jfs2/a HTTP/1.1" 200 -
 * Running on http://127.0.0.1:5999
"#;
        let r = count_requests(log, "jfs");
        assert_eq!((r.put_class, r.get_class), (2, 2));
    }
}
