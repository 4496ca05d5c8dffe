//! `surge torture`: crash an export with SIGKILL again and again and check that
//! nothing acknowledged before the last completed FLUSH is lost.

use crate::torture::{self, Config};
use anyhow::Context as _;
use std::path::PathBuf;
use std::time::Duration;

const LONG_ABOUT: &str = "\
Run an export under a real NBD client workload, kill the server with SIGKILL at \
seeded moments, restart it and verify the durability contract: every block holds \
what was acknowledged before the last completed FLUSH (or FUA write), or a version \
written after it; nothing else. Exits non-zero on any loss.

The export is served by `surge serve --export t=SPEC` (this binary) in a fresh \
data directory, so SPEC is anything `surge serve --export NAME=SPEC` accepts; \
relative paths are taken from that directory.";

const EXAMPLES: &str = "\
Examples:
  surge torture --export file:t.img,create=64MiB --cycles 200 --seed 7
  surge torture --pool base=file:t.img,create=64MiB --export fault:base,volatile --cycles 20
  # a broken device (acknowledges flushes it never did): must report losses
  surge torture --pool base=file:t.img,create=64MiB --export fault:base,volatile,flush.drop --cycles 5
  # an elastic export with faults on both devices; reported losses are acknowledged
  surge torture --ack-losses --cycles 20 --export 'elastic:backing=reserved:64MiB,bw=20MB/s,cache=reserved,cache_bw=400MB/s,\
    initial=16MiB,min=4MiB,granularity=4MiB,attach_delay=0s,window=1s,id=2s,backing_fault.volatile,backing_fault.flush.fail_loses,\
    backing_fault.flush.fail_prob=0.02,cache_fault.write.fail_prob=0.001,cache_fault.vanish_after=20000'";

#[derive(clap::Args, Debug)]
#[command(about = "Kill/restart torture test of an export's durability", long_about = LONG_ABOUT, after_long_help = EXAMPLES)]
pub struct Args {
    /// The export under test, KIND:ARGS (as after NAME= in `surge serve --export`).
    #[arg(long, value_name = "SPEC", default_value = "file:torture.img,create=64MiB")]
    pub export: String,
    /// A pool for the export to build on, NAME=KIND:ARGS (repeatable; passed to serve).
    #[arg(long = "pool", value_name = "NAME=KIND:ARGS")]
    pub pools: Vec<String>,
    /// Kill/restart cycles.
    #[arg(long, default_value_t = 20)]
    pub cycles: u64,
    /// Seed of the workload and the kill points [default: from the clock, printed].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop starting new cycles after this many seconds.
    #[arg(long, value_name = "SECS")]
    pub time_limit: Option<f64>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Work directory (kept afterwards) [default: a fresh temporary one, removed on success].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Block size of the workload, bytes.
    #[arg(long, default_value_t = 4096)]
    pub block_size: u32,
    /// Bytes of the export exercised, e.g. 16MiB (capped at the export size).
    #[arg(long, default_value = "16MiB")]
    pub region: String,
    /// Kill after a seeded number of requests in 1..=N.
    #[arg(long, default_value_t = 2000)]
    pub max_ops: u64,
    /// Average writes between flushes.
    #[arg(long, default_value_t = 32)]
    pub flush_every: u64,
    /// Requests in flight.
    #[arg(long, default_value_t = 8)]
    pub queue_depth: usize,
    /// Largest write, in blocks.
    #[arg(long, default_value_t = 8)]
    pub max_write_blocks: u64,
    /// After a FLUSH fails, settle it through the control socket: wait while an
    /// elastic export rescues blocks of a failed cache volume, acknowledge a
    /// reported loss (`surge set t/elastic ack_lost=true`; the checker then
    /// treats every write since the last completed FLUSH as unspecified), FLUSH
    /// again. For elastic exports with fault rules.
    #[arg(long)]
    pub ack_losses: bool,
    /// Extra argument for `surge serve` (repeatable), e.g. --serve-arg=--workers=2.
    #[arg(long = "serve-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub serve_args: Vec<String>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64 % 1_000_000).unwrap_or(1)
    });
    let region = crate::stack::parse_size(&args.region).map_err(|e| anyhow::anyhow!("--region: {e}"))?;
    let (data_dir, temporary) = match &args.data_dir {
        Some(d) => (d.clone(), false),
        None => {
            let d = std::env::temp_dir().join(format!("surge-torture-{}-{seed}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            (d, true)
        }
    };
    anyhow::ensure!(args.cycles > 0, "--cycles must be at least 1");
    let cfg = Config {
        spec: args.export.clone(),
        pools: args.pools.clone(),
        serve_args: args.serve_args.clone(),
        cycles: args.cycles,
        seed,
        time_limit: args.time_limit.map(Duration::from_secs_f64),
        data_dir: data_dir.clone(),
        block_size: args.block_size,
        region,
        max_ops: args.max_ops,
        flush_every: args.flush_every,
        queue_depth: args.queue_depth,
        max_write_blocks: args.max_write_blocks,
        surge_exe: std::env::current_exe().context("finding the surge binary")?,
        ack_losses: args.ack_losses.then(|| format!("{}/elastic", torture::EXPORT)),
    };
    if !args.json {
        eprintln!("torture: export {} seed {seed}, {} cycles, data dir {}", cfg.spec, cfg.cycles, data_dir.display());
    }
    let json = args.json;
    let report = torture::run(&cfg, |r| {
        if !json {
            eprintln!(
                "cycle {:>4}: {} writes acked, {} flushes, {} MiB verified, {} losses",
                r.cycles,
                r.writes_acked,
                r.flushes_acked,
                r.bytes_verified >> 20,
                r.losses
            );
        }
    })
    .with_context(|| format!("torture run (seed {seed}, work dir {} kept)", data_dir.display()))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "cycles {} kills {} | writes sent {} acked {} (FUA {}) zeroes {} flushes {} | request errors {} | losses acknowledged {} unsettled flushes {} unreadable {} | verified {} blocks = {} bytes | losses {} | {:.1} s",
            report.cycles,
            report.kills,
            report.writes_sent,
            report.writes_acked,
            report.fua_writes_acked,
            report.zeroes_acked,
            report.flushes_acked,
            report.request_errors,
            report.losses_acknowledged,
            report.flushes_unsettled,
            report.unreadable_blocks,
            report.blocks_verified,
            report.bytes_verified,
            report.losses,
            report.elapsed_secs
        );
        for l in &report.loss_examples {
            println!(
                "  LOSS after cycle {}: block {} holds {}; legal: generation {} (stable) or {:?} (written since)",
                l.after_cycle, l.loss.block, l.loss.found, l.loss.stable, l.loss.written_since
            );
        }
    }
    if report.losses > 0 {
        anyhow::bail!("{} blocks lost acknowledged data (seed {seed}; work dir {} kept)", report.losses, data_dir.display());
    }
    if temporary {
        let _ = std::fs::remove_dir_all(&data_dir);
    }
    Ok(())
}
