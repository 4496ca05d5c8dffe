//! Export allow-lists by client address.
//!
//! An [`AllowList`] is a list of rules: an IP network (`10.0.0.0/8`,
//! `fd00::/8`), a single address (`127.0.0.1`, `::1`), or `unix` (any client
//! on a unix socket: those are guarded by the socket file's permissions).
//! A client may use an export when any rule matches its [`Peer`] address.
//! IPv4 clients reaching a dual-stack (`[::]`) listener appear as
//! `::ffff:a.b.c.d`; they are matched as the IPv4 address they are.

use ipnet::IpNet;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// Who is on the other end of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A unix-socket client.
    Unix,
    /// A TCP client from this address.
    Tcp(IpAddr),
}

impl Peer {
    /// `Tcp` with IPv4-mapped IPv6 addresses turned back into IPv4.
    pub fn tcp(ip: IpAddr) -> Peer {
        Peer::Tcp(canonical(ip))
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Unix => f.write_str("unix"),
            Peer::Tcp(ip) => write!(f, "{ip}"),
        }
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// One allow-list entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowRule {
    /// Clients on unix sockets.
    Unix,
    /// TCP clients whose address is in this network (a single address is a /32 or /128).
    Net(IpNet),
}

impl AllowRule {
    pub fn matches(&self, peer: &Peer) -> bool {
        match (self, peer) {
            (AllowRule::Unix, Peer::Unix) => true,
            (AllowRule::Net(net), Peer::Tcp(ip)) => net.contains(&canonical(*ip)),
            _ => false,
        }
    }
}

impl fmt::Display for AllowRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllowRule::Unix => f.write_str("unix"),
            AllowRule::Net(n) if n.prefix_len() == n.max_prefix_len() => write!(f, "{}", n.addr()),
            AllowRule::Net(n) => write!(f, "{n}"),
        }
    }
}

/// Why an allow-list entry did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("allow-list entry {entry:?}: {why} (expected an address like 127.0.0.1 or ::1, a network like 10.0.0.0/8, or `unix`)")]
pub struct AllowParseError {
    pub entry: String,
    pub why: String,
}

impl FromStr for AllowRule {
    type Err = AllowParseError;
    fn from_str(s: &str) -> Result<Self, AllowParseError> {
        let err = |why: &str| AllowParseError { entry: s.to_string(), why: why.to_string() };
        let t = s.trim();
        if t.eq_ignore_ascii_case("unix") {
            return Ok(AllowRule::Unix);
        }
        if t.is_empty() {
            return Err(err("empty"));
        }
        if let Some((addr, len)) = t.split_once('/') {
            let ip: IpAddr = addr.parse().map_err(|_| err("not an IP address before the /"))?;
            let len: u8 = len.parse().map_err(|_| err("the prefix length after / is not a number"))?;
            let net = IpNet::new(canonical(ip), len).map_err(|_| err("prefix length too long for the address"))?;
            // 10.1.2.3/8 means 10.0.0.0/8; say so rather than guess.
            if net.trunc() != net {
                return Err(err(&format!("host bits are set; did you mean {}?", net.trunc())));
            }
            return Ok(AllowRule::Net(net));
        }
        let ip: IpAddr = t.parse().map_err(|_| err("not an IP address, network or `unix`"))?;
        Ok(AllowRule::Net(IpNet::from(canonical(ip))))
    }
}

/// The clients that may use an export (any rule matching admits the client).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AllowList(pub Vec<AllowRule>);

impl AllowList {
    pub fn allows(&self, peer: &Peer) -> bool {
        self.0.iter().any(|r| r.matches(peer))
    }
}

impl FromStr for AllowList {
    type Err = AllowParseError;
    /// Comma-separated rules: `127.0.0.1,10.0.0.0/8,unix`.
    fn from_str(s: &str) -> Result<Self, AllowParseError> {
        if s.trim().is_empty() {
            return Err(AllowParseError { entry: s.to_string(), why: "empty list (it would admit nobody)".into() });
        }
        s.split(',').map(str::parse).collect::<Result<_, _>>().map(AllowList)
    }
}

impl fmt::Display for AllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(s: &str) -> Peer {
        Peer::tcp(s.parse().unwrap())
    }

    #[test]
    fn networks_addresses_and_unix_match_what_they_say() {
        let l: AllowList = "127.0.0.1, 10.0.0.0/8,unix,fd00::/8".parse().unwrap();
        assert!(l.allows(&tcp("127.0.0.1")));
        assert!(!l.allows(&tcp("127.0.0.2")));
        assert!(l.allows(&tcp("10.255.1.2")));
        assert!(!l.allows(&tcp("11.0.0.1")));
        assert!(l.allows(&Peer::Unix));
        assert!(l.allows(&tcp("fd12::1")));
        assert!(!l.allows(&tcp("::1")));
        assert_eq!(l.to_string(), "127.0.0.1,10.0.0.0/8,unix,fd00::/8");
    }

    #[test]
    fn without_unix_a_unix_client_is_refused_and_vice_versa() {
        let l: AllowList = "0.0.0.0/0,::/0".parse().unwrap();
        assert!(l.allows(&tcp("192.0.2.7")) && l.allows(&tcp("2001:db8::1")));
        assert!(!l.allows(&Peer::Unix));
        let u: AllowList = "unix".parse().unwrap();
        assert!(u.allows(&Peer::Unix) && !u.allows(&tcp("127.0.0.1")));
    }

    #[test]
    fn ipv4_mapped_ipv6_clients_match_ipv4_rules() {
        let l: AllowList = "10.0.0.0/8".parse().unwrap();
        assert!(l.allows(&Peer::Tcp("::ffff:10.1.2.3".parse().unwrap())));
        assert!(l.allows(&tcp("::ffff:10.1.2.3")));
        assert!(!l.allows(&tcp("::ffff:11.1.2.3")));
        // A mapped address in a rule means the IPv4 address.
        let m: AllowList = "::ffff:192.0.2.1".parse().unwrap();
        assert!(m.allows(&tcp("192.0.2.1")));
        assert_eq!(tcp("::ffff:127.0.0.1").to_string(), "127.0.0.1");
    }

    #[test]
    fn bad_entries_are_errors_that_say_what_is_wrong() {
        for (bad, why) in [
            ("", "empty list"),
            ("10.0.0.0/8,", "empty"),
            ("localhost", "not an IP address"),
            ("10.0.0.0/33", "prefix length too long"),
            ("10.0.0.0/x", "not a number"),
            ("10.1.2.3/8", "did you mean 10.0.0.0/8"),
            ("300.1.1.1", "not an IP address"),
            ("tcp", "not an IP address"),
        ] {
            let e = bad.parse::<AllowList>().expect_err(bad).to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        assert!("10.0.0.1/8".parse::<AllowRule>().unwrap_err().to_string().contains("127.0.0.1"));
    }
}
