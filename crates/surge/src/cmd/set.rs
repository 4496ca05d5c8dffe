//! `surge set TARGET key=value...`: change settings of a running daemon.

use crate::cmd::status::ControlArgs;
use crate::control::{self, Request};

#[derive(clap::Args, Debug)]
#[command(
    about = "Change settings of a running `surge serve` (see `surge status` for targets)",
    after_long_help = "Examples:\n  surge set disk/cache mode=writethrough\n  surge set tenant-a weight=4 limit=100MB/s\n  surge set app record_dir=/var/tmp/app.trace record=on    (then record=off)"
)]
pub struct Args {
    /// The target's name as `surge status` lists it.
    pub target: String,
    /// Settings to change, applied in order; stops at the first refused one.
    #[arg(required = true, value_name = "KEY=VALUE", value_parser = parse_assignment)]
    pub settings: Vec<(String, String)>,
    #[command(flatten)]
    pub control: ControlArgs,
}

fn parse_assignment(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let socket = args.control.socket()?;
    for (key, value) in args.settings {
        let req = Request::Set { target: args.target.clone(), key: key.clone(), value: value.clone() };
        let resp = control::call(&socket, &req)?;
        anyhow::ensure!(resp.ok, "{} {key}={value}: {}", args.target, resp.error.unwrap_or_default());
        println!("{} {key}={value}: ok", args.target);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignments_need_a_key() {
        assert_eq!(parse_assignment("weight=4").unwrap(), ("weight".into(), "4".into()));
        assert_eq!(parse_assignment("rule=a=b").unwrap(), ("rule".into(), "a=b".into()));
        assert!(parse_assignment("weight").unwrap_err().contains("KEY=VALUE"));
        assert!(parse_assignment("=4").is_err());
    }
}
