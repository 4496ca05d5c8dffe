//! `surge experiment NAME --out DIR [--quick]`: self-contained experiments on the
//! local cloud. Each lives in `crate::experiment::<name>` and writes `report.md`,
//! `results.json` and plots into the output directory.

use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Which experiment to run.
    pub name: String,
    /// Directory for report.md, results.json and plots (created if missing).
    #[arg(long, default_value = "out")]
    pub out: PathBuf,
    /// Reduced scale for CI: same proportions, shorter run.
    #[arg(long)]
    pub quick: bool,
    /// Data servers of the parallel store (fairshare; the paper had 8).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(2..=32))]
    pub servers: u64,
    /// Client processes per application across the servers (fairshare; default
    /// the paper's 32, with --quick 8).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub clients: Option<u64>,
    /// Write report.md and the plots again from the results.json already in
    /// --out, measuring nothing (streaming).
    #[arg(long)]
    pub report_only: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.report_only {
        anyhow::ensure!(args.name == "streaming", "--report-only is supported by the streaming experiment only, not {:?}", args.name);
        return crate::experiment::streaming::rewrite_report(&args.out);
    }
    std::fs::create_dir_all(&args.out)?;
    crate::experiment::progress::start(&args.name);
    let r = match args.name.as_str() {
        "elastic" => crate::experiment::elastic::run(&args.out, args.quick),
        "fairshare" => crate::experiment::fairshare::run(&args.out, args.quick, args.servers as usize, args.clients.map(|c| c as usize)),
        "streaming" => crate::experiment::streaming::run(&args.out, args.quick),
        "burstable" => crate::experiment::burstable::run(&args.out, args.quick),
        "burstbuffer" => crate::experiment::burstbuffer::run(&args.out, args.quick),
        "plan" => crate::experiment::plan::run(&args.out, args.quick),
        other => Err(anyhow::anyhow!("unknown experiment {other:?}; known: elastic, fairshare, streaming, burstable, burstbuffer, plan")),
    };
    crate::experiment::progress::finish();
    r
}
