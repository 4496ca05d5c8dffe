//! Log setup: what the default level shows, text or JSON lines.
//!
//! The default shows what an operator acts on: the elastic controller's
//! decisions (with their reasons), warnings and errors; routine events (every
//! volume attach, every NBD connection, cache attach/detach) are at `info` in
//! their crates and stay hidden unless asked for (`--log info`).
//! Experiments and `surge top` own the terminal: warnings and errors only.

use tracing_subscriber::EnvFilter;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Decisions of the elastic policy and controller, plus every warning and error.
pub const DEFAULT_FILTER: &str = "warn,surge_policy=info,surge::stack::elastic=info,surge::cmd::serve=info";
pub const QUIET_FILTER: &str = "warn";

pub fn filter(given: Option<&str>, quiet: bool) -> EnvFilter {
    let default = if quiet { QUIET_FILTER } else { DEFAULT_FILTER };
    match given {
        Some(f) => EnvFilter::try_new(f).unwrap_or_else(|e| {
            eprintln!("surge: --log {f:?} is not a valid filter ({e}); using {default:?}");
            EnvFilter::new(default)
        }),
        None => EnvFilter::new(default),
    }
}

type Setter = Box<dyn Fn(EnvFilter) -> Result<(), String> + Send + Sync>;

/// Changes the filter of the running subscriber (SIGHUP reloads `log`).
static SET_FILTER: std::sync::OnceLock<Setter> = std::sync::OnceLock::new();

pub fn init(given: Option<&str>, format: LogFormat, quiet: bool) {
    let builder = tracing_subscriber::fmt().with_env_filter(filter(given, quiet)).with_writer(std::io::stderr);
    let setter: Setter = match format {
        LogFormat::Json => {
            let b = builder.json().with_current_span(false).with_filter_reloading();
            let h = b.reload_handle();
            b.init();
            Box::new(move |f| h.reload(f).map_err(|e| e.to_string()))
        }
        LogFormat::Text => {
            let b = builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).with_filter_reloading();
            let h = b.reload_handle();
            b.init();
            Box::new(move |f| h.reload(f).map_err(|e| e.to_string()))
        }
    };
    let _ = SET_FILTER.set(setter);
}

/// Replace the log filter (`""`: the default).
pub fn set_filter(f: &str) -> Result<(), String> {
    let filter = if f.is_empty() { EnvFilter::new(DEFAULT_FILTER) } else { EnvFilter::try_new(f).map_err(|e| e.to_string())? };
    match SET_FILTER.get() {
        Some(set) => set(filter),
        None => Err("logging is not set up".into()),
    }
}
