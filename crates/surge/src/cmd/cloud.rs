//! `surge cloud create|list|show|delete|cost|gc`: the volumes of a cloud
//! provider (the local emulated cloud by default, `--provider aws` for EBS).
//! The builder behind `surge serve --export NAME=TYPE:SIZE` is `stack::volume`.

use crate::stack::volume::cloud_dir;
use anyhow::Context;
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use surge_block::SystemClock;
use surge_cloud::{CreateRequest, LocalConfig, LocalProvider, PriceTable, Provider, VolumeInfo, VolumeSpec};

#[derive(clap::Args)]
pub struct Args {
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// surge's data directory; the local cloud lives in DIR/cloud
    /// [default: the user data dir, e.g. ~/.local/share/surge].
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Which cloud: local (the emulated cloud in DIR/cloud) or aws (EBS volumes
    /// tagged surge:owner; credentials and region from the usual AWS chain) [default: local].
    #[arg(long, global = true, value_enum, value_name = "PROVIDER")]
    provider: Option<crate::cloud::ProviderKind>,
    /// A `surge serve` config file to take `provider` and `[aws]` from.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Create a volume: TYPE:SIZE[,key=value...], e.g. gp2:100GiB,
    /// reserved:10GiB,bw=33MB/s, io1:100GiB,iops=30000, st1:2TiB.
    Create {
        spec: String,
        /// A unique name (what `surge serve --export NAME=...` looks for).
        #[arg(long)]
        name: Option<String>,
    },
    /// List volumes with their state and burst credits.
    List,
    /// Show one volume (by id or name).
    Show { volume: String },
    /// Delete volumes (by id or name); they must be detached.
    Delete {
        #[arg(required = true)]
        volumes: Vec<String>,
    },
    /// Cost so far, per volume (deleted ones included) and in total.
    Cost {
        /// TOML file overriding list prices, e.g. `[gp2]` `gb_month = 0.12`.
        #[arg(long, value_name = "FILE")]
        prices: Option<PathBuf>,
    },
    /// List and delete orphans: surge volumes that are not attached, have no
    /// name (surge finds the volumes it keeps by name) and are older than --min-age.
    Gc {
        /// Only list what would be deleted.
        #[arg(long)]
        dry_run: bool,
        /// Leave younger volumes alone (one may be between create and attach).
        #[arg(long, default_value = "10m", value_parser = surge_block::units::parse_duration)]
        min_age: std::time::Duration,
        /// Also delete named unattached volumes (e.g. caches of an elastic export
        /// removed for good: they may hold its unflushed data).
        #[arg(long)]
        named: bool,
    },
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let data_dir = match args.data_dir {
        Some(d) => d,
        None => crate::config::default_data_dir()?,
    };
    let (file_provider, aws) = crate::cloud::load_section(args.config.as_deref())?;
    let kind = args.provider.or(file_provider).unwrap_or_default();
    let p: Arc<dyn Provider> = match kind {
        crate::cloud::ProviderKind::Local => {
            let mut cfg = LocalConfig::new(cloud_dir(&data_dir));
            if let Cmd::Cost { prices: Some(f) } = &args.cmd {
                let s = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
                cfg.prices = PriceTable::from_toml(&s).with_context(|| format!("price file {}", f.display()))?;
            }
            Arc::new(LocalProvider::open(cfg, Arc::new(SystemClock::new()))?)
        }
        other => crate::cloud::open(other, aws.as_ref(), &data_dir)?,
    };
    let out = |v: serde_json::Value| println!("{}", serde_json::to_string_pretty(&v).expect("json"));
    match args.cmd {
        Cmd::Create { spec, name } => {
            let spec: VolumeSpec = spec.parse()?;
            let v = p.create(CreateRequest { spec, name })?;
            if args.json {
                out(json!(v));
            } else {
                println!("{}", v.id);
            }
        }
        Cmd::List => {
            let vols = p.list()?;
            if args.json {
                out(json!(vols));
            } else {
                print_table(&vols);
            }
        }
        Cmd::Show { volume } => {
            let v = p.describe(&volume)?;
            if args.json {
                out(json!(v));
            } else {
                print_table(&[v]);
            }
        }
        Cmd::Delete { volumes } => {
            for v in volumes {
                p.delete(&v)?;
                if !args.json {
                    println!("deleted {v}");
                }
            }
        }
        Cmd::Gc { dry_run, min_age, named } => {
            let opts = surge_cloud::gc::GcOptions { min_age, named, dry_run };
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
            let r = surge_cloud::gc::collect(p.as_ref(), &opts, now)?;
            if args.json {
                let kept: Vec<_> = r.kept.iter().map(|(v, why)| json!({"volume": v, "why": why})).collect();
                let failed: Vec<_> = r.failed.iter().map(|(id, e)| json!({"id": id, "error": e})).collect();
                out(json!({"orphans": r.orphans, "deleted": !dry_run, "kept": kept, "failed": failed}));
            } else {
                let verb = if dry_run { "would delete" } else { "deleted" };
                for v in &r.orphans {
                    if !r.failed.iter().any(|(id, _)| *id == v.id) {
                        println!("{verb} {} {}", v.id, v.spec);
                    }
                }
                for (v, why) in &r.kept {
                    println!("kept {} {}: {why}", v.id, v.spec);
                }
                for (id, e) in &r.failed {
                    println!("FAILED to delete {id}: {e}");
                }
                if r.orphans.is_empty() {
                    println!("no orphans");
                }
            }
            anyhow::ensure!(r.failed.is_empty(), "{} orphan(s) could not be deleted", r.failed.len());
        }
        Cmd::Cost { .. } => {
            let r = p.cost()?;
            if args.json {
                out(json!(r));
            } else {
                println!("{:<12} {:<10} {:<36} {:>10} {:>12} {:>14}", "ID", "NAME", "SPEC", "BILLED_S", "USD", "AGBS");
                for v in &r.volumes {
                    println!(
                        "{:<12} {:<10} {:<36} {:>10} {:>12.6} {:>14}{}",
                        v.id,
                        v.name.as_deref().unwrap_or("-"),
                        v.spec,
                        v.billed_seconds,
                        v.usd,
                        v.agbs.map_or("-".to_string(), |a| format!("{a:.1}")),
                        if v.deleted { "  (deleted)" } else if !v.priced { "  (no list price)" } else { "" }
                    );
                }
                println!("total: ${:.6}, {:.1} AGBs (prices: {}, {})", r.total_usd, r.total_agbs, r.price_source, r.price_date);
            }
        }
    }
    Ok(())
}

fn credits_text(v: &VolumeInfo) -> String {
    match (v.credits.ops, v.credits.bytes, v.credits.percent()) {
        (Some(o), _, Some(p)) => format!("{o} ops ({p:.1}%)"),
        (None, Some(b), Some(p)) => format!("{} MiB ({p:.1}%)", b >> 20),
        _ => "-".into(),
    }
}

fn print_table(vols: &[VolumeInfo]) {
    println!("{:<12} {:<10} {:<9} {:<36} {:<24}", "ID", "NAME", "STATE", "SPEC", "CREDITS");
    for v in vols {
        let state = format!("{:?}", v.state).to_lowercase();
        println!("{:<12} {:<10} {:<9} {:<36} {:<24}", v.id, v.name.as_deref().unwrap_or("-"), state, v.spec, credits_text(v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn cli(d: &std::path::Path, args: &[&str]) -> anyhow::Result<()> {
        use clap::Parser;
        let mut v = vec!["cloud", "--data-dir", d.to_str().unwrap()];
        v.extend_from_slice(args);
        run(Cli::try_parse_from(v)?.args)
    }

    #[test]
    fn the_cli_creates_lists_costs_and_deletes() {
        let d = tempfile::tempdir().unwrap();
        cli(d.path(), &["create", "reserved:1GiB,bw=33MB/s", "--name", "slow"]).unwrap();
        cli(d.path(), &["create", "--json", "st1:125GiB"]).unwrap();
        cli(d.path(), &["list", "--json"]).unwrap();
        cli(d.path(), &["cost"]).unwrap();
        let e = cli(d.path(), &["create", "st1:1GiB"]).unwrap_err().to_string();
        assert!(e.contains("st1 volume size must be between 125 GiB"), "{e}");
        let e = cli(d.path(), &["delete", "nope"]).unwrap_err().to_string();
        assert_eq!(e, "delete nope: no such volume");
        cli(d.path(), &["delete", "slow", "vol-000002"]).unwrap();
        let p = LocalProvider::open(LocalConfig::new(cloud_dir(d.path())), Arc::new(SystemClock::new())).unwrap();
        assert!(p.list().unwrap().is_empty());
        assert_eq!(p.cost().unwrap().volumes.len(), 2, "deleted volumes stay on the bill");
        let f = d.path().join("p.toml");
        std::fs::write(&f, "[gp2]\ngb_month = \"x\"").unwrap();
        assert!(cli(d.path(), &["cost", "--prices", f.to_str().unwrap()]).unwrap_err().to_string().contains("price file"));
    }

    #[test]
    fn gc_deletes_unnamed_unattached_volumes_and_keeps_named_ones() {
        let d = tempfile::tempdir().unwrap();
        cli(d.path(), &["create", "gp2:1GiB"]).unwrap();
        cli(d.path(), &["create", "gp2:1GiB", "--name", "keep"]).unwrap();
        let p = || LocalProvider::open(LocalConfig::new(cloud_dir(d.path())), Arc::new(SystemClock::new())).unwrap();
        cli(d.path(), &["gc"]).unwrap();
        assert_eq!(p().list().unwrap().len(), 2, "younger than --min-age: kept");
        cli(d.path(), &["gc", "--min-age", "0s", "--dry-run"]).unwrap();
        assert_eq!(p().list().unwrap().len(), 2);
        cli(d.path(), &["gc", "--min-age", "0s"]).unwrap();
        assert_eq!(p().list().unwrap().into_iter().map(|v| v.name).collect::<Vec<_>>(), [Some("keep".to_string())]);
        #[cfg(not(feature = "aws"))]
        assert!(cli(d.path(), &["gc", "--provider", "aws"]).unwrap_err().to_string().contains("--features aws"));
    }
}
