//! A moto server (EC2 + CloudWatch) started on loopback by the test, and a
//! fault proxy in front of it that throttles, refuses credentials or rewrites
//! replies (an attach that never completes, a volume stuck in-use).

#![allow(dead_code)]

use parking_lot::Mutex;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Moto {
    child: Child,
    pub port: u16,
}

impl Moto {
    /// `python3 -m moto.server` on a loopback port it picks itself (pip
    /// install 'moto[server]'). Picking a free port here and passing it on
    /// raced with the other tests' servers: two could be given the same port,
    /// the second failed to bind, and its test talked to the first one's
    /// server until that test ended ("connection refused").
    pub fn start() -> Moto {
        let mut child = Command::new("python3")
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3 -m moto.server (pip install 'moto[server]')");
        let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
        let port = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| l.split_once("Running on http://127.0.0.1:").and_then(|(_, p)| p.trim().parse::<u16>().ok()))
            .expect("moto server did not say which port it listens on (pip install 'moto[server]')");
        // It logs every request to stderr: keep reading so it never blocks.
        std::thread::spawn(move || lines.for_each(drop));
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(start.elapsed() < Duration::from_secs(60), "moto server did not start on port {port}");
            std::thread::sleep(Duration::from_millis(100));
        }
        Moto { child, port }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the proxy does to requests of one API action.
#[derive(Debug, Clone)]
pub enum Rule {
    /// Answer the next `times` requests with this HTTP status and error code.
    Fail { action: String, times: u32, status: u16, code: String },
    /// Forward, then replace `from` with `to` in the reply (while `times` > 0).
    Rewrite { action: String, times: u32, from: String, to: String },
}

#[derive(Default)]
pub struct ProxyState {
    pub rules: Vec<Rule>,
    /// Every action seen, in order.
    pub seen: Vec<String>,
}

pub struct Proxy {
    pub port: u16,
    pub state: Arc<Mutex<ProxyState>>,
}

impl Proxy {
    pub fn start(upstream: u16) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(ProxyState::default()));
        let st = state.clone();
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let st = st.clone();
                std::thread::spawn(move || {
                    let _ = serve(c, upstream, &st);
                });
            }
        });
        Proxy { port, state }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn add(&self, r: Rule) {
        self.state.lock().rules.push(r);
    }

    pub fn clear(&self) {
        self.state.lock().rules.clear();
    }

    pub fn count(&self, action: &str) -> usize {
        self.state.lock().seen.iter().filter(|a| *a == action).count()
    }
}

/// One HTTP/1.1 request: head lines and body.
fn read_request(r: &mut BufReader<TcpStream>) -> std::io::Result<Option<(Vec<String>, Vec<u8>)>> {
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        let line = line.trim_end().to_string();
        if line.is_empty() {
            break;
        }
        head.push(line);
    }
    let len = head
        .iter()
        .find_map(|h| h.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("content-length")).map(|(_, v)| v.trim().parse::<usize>().unwrap_or(0)))
        .unwrap_or(0);
    let mut body = vec![0; len];
    r.read_exact(&mut body)?;
    Ok(Some((head, body)))
}

fn action_of(body: &[u8]) -> String {
    String::from_utf8_lossy(body).split('&').find_map(|kv| kv.strip_prefix("Action=").map(str::to_string)).unwrap_or_default()
}

fn respond(w: &mut TcpStream, status: u16, body: &[u8]) -> std::io::Result<()> {
    write!(w, "HTTP/1.1 {status} X\r\nContent-Type: text/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len())?;
    w.write_all(body)?;
    w.flush()
}

fn serve(c: TcpStream, upstream: u16, st: &Mutex<ProxyState>) -> std::io::Result<()> {
    let mut w = c.try_clone()?;
    let mut r = BufReader::new(c);
    let Some((head, body)) = read_request(&mut r)? else { return Ok(()) };
    let action = action_of(&body);
    // Pick the first live rule for this action and use it up.
    let rule = {
        let mut s = st.lock();
        s.seen.push(action.clone());
        let mut picked = None;
        for rule in s.rules.iter_mut() {
            match rule {
                Rule::Fail { action: a, times, status, code } if *a == action && *times > 0 => {
                    *times -= 1;
                    picked = Some(Rule::Fail { action: a.clone(), times: 0, status: *status, code: code.clone() });
                    break;
                }
                Rule::Rewrite { action: a, times, from, to } if *a == action && *times > 0 => {
                    *times -= 1;
                    picked = Some(Rule::Rewrite { action: a.clone(), times: 0, from: from.clone(), to: to.clone() });
                    break;
                }
                _ => {}
            }
        }
        picked
    };
    if let Some(Rule::Fail { status, code, .. }) = &rule {
        let xml = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code>\
             <Message>injected by the test proxy</Message></Error></Errors><RequestID>test</RequestID></Response>"
        );
        return respond(&mut w, *status, xml.as_bytes());
    }
    // Forward on a fresh connection that closes after the reply.
    let mut up = TcpStream::connect(("127.0.0.1", upstream))?;
    for h in head.iter().filter(|h| !h.to_ascii_lowercase().starts_with("connection:")) {
        write!(up, "{h}\r\n")?;
    }
    write!(up, "Connection: close\r\n\r\n")?;
    up.write_all(&body)?;
    let mut ur = BufReader::new(up);
    let mut status_line = String::new();
    ur.read_line(&mut status_line)?;
    let status: u16 = status_line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(502);
    let mut len = None;
    loop {
        let mut line = String::new();
        if ur.read_line(&mut line)? == 0 || line.trim_end().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse::<usize>().ok();
            }
        }
    }
    let mut reply = Vec::new();
    match len {
        Some(n) => {
            reply.resize(n, 0);
            ur.read_exact(&mut reply)?;
        }
        None => {
            ur.read_to_end(&mut reply)?;
        }
    }
    if let Some(Rule::Rewrite { from, to, .. }) = &rule {
        reply = String::from_utf8_lossy(&reply).replace(from.as_str(), to).into_bytes();
    }
    respond(&mut w, status, &reply)
}

/// moto accepts any credentials: point the SDK at test ones, once per test
/// process, so that nothing comes from this machine's AWS setup.
pub fn test_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
        std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
        std::env::set_var("AWS_CONFIG_FILE", "/nonexistent/surge-test");
        std::env::set_var("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/surge-test");
        std::env::remove_var("AWS_SESSION_TOKEN");
        std::env::remove_var("AWS_PROFILE");
    });
}
