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
}

pub fn run(args: Args) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out)?;
    crate::experiment::progress::start(&args.name);
    let r = match args.name.as_str() {
        "elastic" => crate::experiment::elastic::run(&args.out, args.quick),
        "fairshare" => crate::experiment::fairshare::run(&args.out, args.quick, args.servers as usize),
        "streaming" => crate::experiment::streaming::run(&args.out, args.quick),
        "burstable" => crate::experiment::burstable::run(&args.out, args.quick),
        "burstbuffer" => crate::experiment::burstbuffer::run(&args.out, args.quick),
        other => Err(anyhow::anyhow!("unknown experiment {other:?}; known: elastic, fairshare, streaming, burstable, burstbuffer")),
    };
    crate::experiment::progress::finish();
    r
}
