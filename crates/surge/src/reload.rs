//! SIGHUP: re-read `surge serve --config FILE` and apply what can change on a
//! running daemon without touching data or clients:
//!
//! - `log`: the log filter;
//! - a `share:` export's `weight`, `limit`, `reservation`, `depth`, `adaptive`
//!   (applied like `surge qos set`);
//! - a cloud volume export's parameters, same type and size (e.g. gp3 `iops`,
//!   `throughput`; applied like `surge set NAME/volume spec=...`).
//!
//! The TLS certificate and key (and the CA of client certificates) are
//! re-read from the running `tls_certs` directory on every SIGHUP (see
//! `cmd::serve`), so renewed certificates need no restart.
//!
//! Everything else needs a restart and is reported, not applied: listeners,
//! the TLS mode, `tls_certs`, `tls_verify_peer`, workers, data_dir, control,
//! metrics and `metrics_allow`, connection caps, `[coop]`, provider and
//! `[aws]`, pools, added or removed exports, `read_only`, `allow`, and any
//! other spec change (new kind, size, path, elastic settings). The running
//! daemon keeps its old values for those until restarted (an admin who turns
//! on mutual TLS and reloads is told it is not on yet).

use crate::config::FileConfig;
use crate::control::Registry;
use crate::stack::{ExportSpec, Opts};

/// One live change: `surge set TARGET KEY=VALUE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub target: String,
    pub key: String,
    pub value: String,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reload {
    pub changes: Vec<Change>,
    /// A new log filter (`Some("")`: back to the default).
    pub log: Option<String>,
    /// What changed but needs a restart, one line each.
    pub restart: Vec<String>,
}

/// Tenant settings a running fair queue takes live.
const LIVE_SHARE_KEYS: &[&str] = &["weight", "limit", "reservation", "depth", "adaptive"];

/// A share spec's pool and its `key=value` options.
type ShareOpts = (Option<String>, Vec<(String, String)>);

fn share_opts(args: &str) -> Option<ShareOpts> {
    let mut o = Opts::parse("share", args).ok()?;
    let pool = o.positional();
    let mut kv = Vec::new();
    for k in ["tenant", "weight", "limit", "reservation", "depth", "adaptive", "overhead"] {
        if let Some(v) = o.take(k) {
            kv.push((k.to_string(), v));
        }
    }
    o.finish(&[]).ok()?;
    Some((pool, kv))
}

/// Live changes that turn share spec `old` into `new`, or why it needs a restart.
fn share_changes(export: &str, old: &str, new: &str) -> Result<Vec<Change>, String> {
    let (Some((op, okv)), Some((np, nkv))) = (share_opts(old), share_opts(new)) else {
        return Err("its spec does not parse".into());
    };
    let get = |kv: &[(String, String)], k: &str| kv.iter().find(|(x, _)| x == k).map(|(_, v)| v.clone());
    if op != np || get(&okv, "tenant") != get(&nkv, "tenant") || get(&okv, "overhead") != get(&nkv, "overhead") {
        return Err("its pool, tenant or overhead changed".into());
    }
    let tenant = get(&nkv, "tenant").unwrap_or_else(|| export.to_string());
    let mut out = Vec::new();
    for k in LIVE_SHARE_KEYS {
        let (o, n) = (get(&okv, k), get(&nkv, k));
        if o != n {
            // A removed key goes back to its default.
            let value = n.unwrap_or_else(|| match *k {
                "weight" => "1".into(),
                "adaptive" => "off".into(),
                "depth" => "0".into(),
                _ => "none".into(),
            });
            out.push(Change { target: format!("qos/{tenant}"), key: k.to_string(), value });
        }
    }
    Ok(out)
}

fn export_changes(old: &ExportSpec, new: &ExportSpec) -> Result<Vec<Change>, String> {
    if old.kind != new.kind {
        return Err(format!("its kind changed ({} -> {})", old.kind, new.kind));
    }
    if old.kind == "share" {
        return share_changes(&new.name, &old.args, &new.args);
    }
    if surge_cloud::spec::is_volume_type(&old.kind) {
        let parse = |s: &ExportSpec| format!("{}:{}", s.kind, s.args).parse::<surge_cloud::VolumeSpec>().map_err(|e| e.to_string());
        let (o, n) = (parse(old)?, parse(new)?);
        if o.size != n.size {
            return Err("its size changed".into());
        }
        return Ok(vec![Change { target: format!("{}/volume", new.name), key: "spec".into(), value: n.to_string() }]);
    }
    Err(format!("{} exports change only on restart", old.kind))
}

/// What reloading `new` over the running `old` does.
pub fn diff(old: &FileConfig, new: &FileConfig) -> Reload {
    let mut r = Reload::default();
    let mut restart = |what: &str, changed: bool| {
        if changed {
            r.restart.push(format!("{what} changed"));
        }
    };
    restart("data_dir", old.data_dir != new.data_dir);
    restart("control", old.control != new.control);
    restart("workers", old.workers != new.workers);
    restart("insecure", old.insecure != new.insecure);
    restart("tls", old.tls != new.tls);
    restart("tls_certs", old.tls_certs != new.tls_certs);
    restart("tls_verify_peer", old.tls_verify_peer != new.tls_verify_peer);
    restart("[coop]", old.coop != new.coop);
    restart("metrics_allow", old.metrics_allow != new.metrics_allow);
    restart("max_connections", old.max_connections != new.max_connections);
    restart("max_connections_per_address", old.max_connections_per_address != new.max_connections_per_address);
    restart("listen", old.listen != new.listen);
    restart("pools", old.pools != new.pools);
    restart("metrics", old.metrics != new.metrics);
    restart("provider", old.provider != new.provider);
    restart("[aws]", old.aws != new.aws);
    if old.log != new.log {
        r.log = Some(new.log.clone().unwrap_or_default());
    }
    for n in &new.exports {
        let Some(o) = old.exports.iter().find(|o| o.name == n.name) else {
            r.restart.push(format!("export {} was added", n.name));
            continue;
        };
        if o.read_only != n.read_only || o.allow != n.allow {
            r.restart.push(format!("export {}: read_only or allow changed", n.name));
        }
        if o.spec == n.spec {
            continue;
        }
        let spec = |e: &crate::config::ExportEntry| format!("{}={}", e.name, e.spec).parse::<ExportSpec>();
        match (spec(o), spec(n)) {
            (Ok(os), Ok(ns)) => match export_changes(&os, &ns) {
                Ok(c) => r.changes.extend(c),
                Err(why) => r.restart.push(format!("export {}: {why}", n.name)),
            },
            (_, Err(e)) => r.restart.push(format!("export {}: {e}", n.name)),
            (Err(_), Ok(_)) => r.restart.push(format!("export {}: spec changed", n.name)),
        }
    }
    for o in &old.exports {
        if !new.exports.iter().any(|n| n.name == o.name) {
            r.restart.push(format!("export {} was removed", o.name));
        }
    }
    r
}

/// Apply the live part of `r`; returns lines saying what happened.
pub fn apply(r: &Reload, registry: &Registry) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(f) = &r.log {
        out.push(match crate::logging::set_filter(f) {
            Ok(()) => format!("log filter is now {:?}", if f.is_empty() { crate::logging::DEFAULT_FILTER } else { f }),
            Err(e) => format!("log filter {f:?} not applied: {e}"),
        });
    }
    for c in &r.changes {
        let res = match registry.find(&c.target) {
            Some(t) => t.set(&c.key, &c.value),
            None => Err(format!("no target {}", c.target)),
        };
        out.push(match res {
            Ok(()) => format!("{} {}={}: applied", c.target, c.key, c.value),
            Err(e) => format!("{} {}={}: not applied: {e}", c.target, c.key, c.value),
        });
    }
    for why in &r.restart {
        out.push(format!("not applied, needs a restart: {why}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> FileConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn share_weights_volume_parameters_and_the_log_filter_change_live() {
        let old = cfg("[[export]]\nname='a'\nspec='share:p,weight=1'\n[[export]]\nname='g'\nspec='gp3:8GiB'\n");
        let new = cfg("log='debug'\n[[export]]\nname='a'\nspec='share:p,weight=4,limit=10MB/s'\n[[export]]\nname='g'\nspec='gp3:8GiB,iops=6000'\n");
        let r = diff(&old, &new);
        assert_eq!(r.log.as_deref(), Some("debug"));
        assert!(r.restart.is_empty(), "{r:?}");
        let c = |t: &str, k: &str, v: &str| Change { target: t.into(), key: k.into(), value: v.into() };
        assert_eq!(r.changes, [c("qos/a", "weight", "4"), c("qos/a", "limit", "10MB/s"), c("g/volume", "spec", "gp3:8GiB,iops=6000")]);
        // Removing a key sets it back to its default; a named tenant is addressed by that name.
        let r = diff(&cfg("[[export]]\nname='a'\nspec='share:p,tenant=t,weight=3'\n"), &cfg("[[export]]\nname='a'\nspec='share:p,tenant=t'\n"));
        assert_eq!(r.changes, [c("qos/t", "weight", "1")]);
    }

    #[test]
    fn everything_else_is_reported_as_needing_a_restart() {
        let old = cfg("listen=['unix:/a']\n[[export]]\nname='a'\nspec='share:p'\n[[export]]\nname='f'\nspec='memory:1MiB'\n[[export]]\nname='g'\nspec='gp2:8GiB'\n");
        let new = cfg("listen=['unix:/b']\nprovider='aws'\n[[export]]\nname='a'\nspec='share:q'\n[[export]]\nname='g'\nspec='gp2:9GiB'\n[[export]]\nname='n'\nspec='memory:1MiB'\n");
        let r = diff(&old, &new);
        assert!(r.changes.is_empty(), "{r:?}");
        let text = r.restart.join("\n");
        for want in ["listen changed", "provider changed", "export a: its pool, tenant or overhead changed", "export g: its size changed", "export n was added", "export f was removed"] {
            assert!(text.contains(want), "{want:?} missing in {text}");
        }
        // Issue 38 item 10: turning on mutual TLS or changing cooperation on a
        // running daemon is not silently ignored.
        let r = diff(&cfg("tls='require'\n[coop]\nlisten='unix:/c'\n"), &cfg("tls='require'\ntls_verify_peer=true\n[coop]\nlisten='unix:/c'\nkey_file='/k'\n"));
        assert_eq!(r.restart, ["tls_verify_peer changed", "[coop] changed"]);
        assert!(apply(&r, &Registry::new()).iter().all(|l| l.starts_with("not applied, needs a restart")));
        let r = diff(&cfg("[[export]]\nname='e'\nspec='memory:1MiB'\n"), &cfg("[[export]]\nname='e'\nspec='memory:2MiB'\n"));
        assert_eq!(r.restart, ["export e: memory exports change only on restart"]);
        assert_eq!(diff(&old, &old), Reload::default(), "no change, nothing to do");
    }
}
