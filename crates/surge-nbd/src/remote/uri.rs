//! NBD URIs, as libnbd and qemu write them (NetworkBlockDevice/nbd `doc/uri.md`):
//!
//! - `nbd://HOST[:PORT][/EXPORT]` (TCP, port 10809 by default; `[::1]` for IPv6)
//! - `nbd+unix:///EXPORT?socket=PATH` (unix socket)
//! - `nbds://...`, `nbds+unix://...`: the same with TLS required
//!
//! The export name is the path without its leading `/`, percent-decoded. Query
//! parameters: `socket=PATH` (unix only), `tls-certificates=DIR` (a directory
//! holding `ca-cert.pem`, as qemu and nbdkit lay it out), `tls-hostname=NAME`
//! (the name the server certificate must carry; default: the host).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

pub const DEFAULT_PORT: u16 = 10809;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdUri {
    pub endpoint: Endpoint,
    pub export: String,
    pub tls: bool,
    pub tls_certificates: Option<PathBuf>,
    pub tls_hostname: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UriError {
    #[error("{uri:?}: unknown scheme {scheme:?} (use nbd://, nbds://, nbd+unix:// or nbds+unix://)")]
    Scheme { uri: String, scheme: String },
    #[error("{0:?}: not a URI (expected e.g. nbd://host:10809/export)")]
    Shape(String),
    #[error("{0:?}: TCP URIs need a host (nbd://HOST[:PORT]/EXPORT)")]
    MissingHost(String),
    #[error("{uri:?}: bad port {port:?}")]
    Port { uri: String, port: String },
    #[error("{0:?}: unix URIs need ?socket=PATH and no host (nbd+unix:///EXPORT?socket=PATH)")]
    Socket(String),
    #[error("{uri:?}: unknown or repeated query parameter {param:?} (known: socket, tls-certificates, tls-hostname)")]
    Query { uri: String, param: String },
    #[error("{0:?}: bad %-escape")]
    Escape(String),
}

impl NbdUri {
    /// The host name TLS checks the certificate against.
    pub fn tls_server_name(&self) -> String {
        match (&self.tls_hostname, &self.endpoint) {
            (Some(h), _) => h.clone(),
            (None, Endpoint::Tcp { host, .. }) => host.clone(),
            (None, Endpoint::Unix(_)) => "localhost".into(),
        }
    }
}

fn percent_decode(s: &str, uri: &str) -> Result<String, UriError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3).ok_or_else(|| UriError::Escape(uri.into()))?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| UriError::Escape(uri.into()))?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| UriError::Escape(uri.into()))
}

fn percent_encode(s: &str, keep: &[u8]) -> String {
    let mut out = String::new();
    for &c in s.as_bytes() {
        if c.is_ascii_alphanumeric() || b"-._~".contains(&c) || keep.contains(&c) {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

impl FromStr for NbdUri {
    type Err = UriError;

    fn from_str(uri: &str) -> Result<Self, UriError> {
        let (scheme, rest) = uri.split_once("://").ok_or_else(|| UriError::Shape(uri.into()))?;
        let (tls, unix) = match scheme.to_ascii_lowercase().as_str() {
            "nbd" | "nbd+tcp" => (false, false),
            "nbds" | "nbds+tcp" => (true, false),
            "nbd+unix" => (false, true),
            "nbds+unix" => (true, true),
            _ => return Err(UriError::Scheme { uri: uri.into(), scheme: scheme.into() }),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let export = percent_decode(path, uri)?;
        let (mut socket, mut tls_certificates, mut tls_hostname) = (None, None, None);
        for kv in query.unwrap_or("").split('&').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            let v = percent_decode(v, uri)?;
            let slot = match k {
                "socket" => &mut socket,
                "tls-certificates" => &mut tls_certificates,
                "tls-hostname" => &mut tls_hostname,
                _ => return Err(UriError::Query { uri: uri.into(), param: k.into() }),
            };
            if slot.replace(v).is_some() {
                return Err(UriError::Query { uri: uri.into(), param: k.into() });
            }
        }
        let endpoint = if unix {
            match socket {
                Some(p) if authority.is_empty() && !p.is_empty() => Endpoint::Unix(PathBuf::from(p)),
                _ => return Err(UriError::Socket(uri.into())),
            }
        } else {
            if socket.is_some() {
                return Err(UriError::Socket(uri.into()));
            }
            let (host, port) = split_host_port(authority, uri)?;
            Endpoint::Tcp { host, port }
        };
        Ok(NbdUri { endpoint, export, tls, tls_certificates: tls_certificates.map(PathBuf::from), tls_hostname })
    }
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`.
fn split_host_port(authority: &str, uri: &str) -> Result<(String, u16), UriError> {
    let port_of = |p: &str| p.parse::<u16>().ok().filter(|&p| p > 0).ok_or_else(|| UriError::Port { uri: uri.into(), port: p.into() });
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6.split_once(']').ok_or_else(|| UriError::MissingHost(uri.into()))?;
        match after.strip_prefix(':') {
            Some(p) => (h, port_of(p)?),
            None if after.is_empty() => (h, DEFAULT_PORT),
            None => return Err(UriError::Shape(uri.into())),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, port_of(p)?),
            None => (authority, DEFAULT_PORT),
        }
    };
    if host.is_empty() || host.contains(['/', '@', '[', ']']) {
        return Err(UriError::MissingHost(uri.into()));
    }
    Ok((host.to_string(), port))
}

impl fmt::Display for NbdUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.tls { "nbds" } else { "nbd" };
        let export = percent_encode(&self.export, b"/");
        let mut query = Vec::new();
        match &self.endpoint {
            Endpoint::Tcp { host, port } => {
                let host = if host.contains(':') { format!("[{host}]") } else { host.clone() };
                write!(f, "{s}://{host}:{port}/{export}")?;
            }
            Endpoint::Unix(p) => {
                write!(f, "{s}+unix:///{export}")?;
                query.push(format!("socket={}", percent_encode(&p.to_string_lossy(), b"/")));
            }
        }
        if let Some(d) = &self.tls_certificates {
            query.push(format!("tls-certificates={}", percent_encode(&d.to_string_lossy(), b"/")));
        }
        if let Some(h) = &self.tls_hostname {
            query.push(format!("tls-hostname={}", percent_encode(h, b"")));
        }
        if !query.is_empty() {
            write!(f, "?{}", query.join("&"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tcp(host: &str, port: u16) -> Endpoint {
        Endpoint::Tcp { host: host.into(), port }
    }

    #[test]
    fn the_usual_forms_parse() {
        let u: NbdUri = "nbd://storage.example:10810/base".parse().unwrap();
        assert_eq!((u.endpoint, u.export.as_str(), u.tls), (tcp("storage.example", 10810), "base", false));
        let u: NbdUri = "nbd://10.0.0.2".parse().unwrap();
        assert_eq!((u.endpoint, u.export.as_str()), (tcp("10.0.0.2", DEFAULT_PORT), ""));
        let u: NbdUri = "nbds://[::1]:7000/a%20b?tls-certificates=/etc/pki/nbd".parse().unwrap();
        assert_eq!(u.endpoint, tcp("::1", 7000));
        assert_eq!((u.export.as_str(), u.tls), ("a b", true));
        assert_eq!(u.tls_certificates, Some(PathBuf::from("/etc/pki/nbd")));
        assert_eq!(u.tls_server_name(), "::1");
        let u: NbdUri = "nbd+unix:///disk?socket=/tmp/s.sock".parse().unwrap();
        assert_eq!((u.endpoint, u.export.as_str()), (Endpoint::Unix("/tmp/s.sock".into()), "disk"));
        let u: NbdUri = "nbds+unix:///?socket=/s&tls-hostname=srv".parse().unwrap();
        assert!(u.tls);
        assert_eq!(u.tls_server_name(), "srv");
    }

    #[test]
    fn mistakes_are_named() {
        let e = |s: &str| s.parse::<NbdUri>().unwrap_err().to_string();
        assert!(e("http://x/y").contains("unknown scheme"));
        assert!(e("nbd:/x").contains("not a URI"));
        assert!(e("nbd:///x").contains("need a host"));
        assert!(e("nbd://h:0/x").contains("bad port"));
        assert!(e("nbd://h:99999/x").contains("bad port"));
        assert!(e("nbd+unix:///x").contains("socket=PATH"));
        assert!(e("nbd+unix://host/x?socket=/s").contains("socket=PATH"));
        assert!(e("nbd://h/x?socket=/s").contains("socket=PATH"));
        assert!(e("nbd://h/x?speed=9").contains("speed"));
        assert!(e("nbd://h/x?tls-hostname=a&tls-hostname=b").contains("repeated"));
        assert!(e("nbd://h/%zz").contains("escape"));
    }

    proptest! {
        #[test]
        fn parsing_never_panics(s in ".{0,80}") {
            let _ = s.parse::<NbdUri>();
        }

        #[test]
        fn display_parses_back_to_the_same_uri(
            tls in any::<bool>(),
            unix in any::<bool>(),
            host in "[a-z][a-z0-9.-]{0,20}|[0-9a-f:]{2,12}:[0-9a-f]{1,4}",
            port in 1u16..,
            export in ".{0,20}",
            path in "/[a-zA-Z0-9 ._/-]{1,30}",
            certs in proptest::option::of("/[a-z]{1,10}"),
        ) {
            let endpoint = if unix { Endpoint::Unix(PathBuf::from(path)) } else { Endpoint::Tcp { host, port } };
            let u = NbdUri { endpoint, export, tls, tls_certificates: certs.map(PathBuf::from), tls_hostname: None };
            let text = u.to_string();
            prop_assert_eq!(text.parse::<NbdUri>().map_err(|e| TestCaseError::fail(e.to_string()))?, u);
        }
    }
}
