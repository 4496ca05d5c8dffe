//! `surge trace import` and `surge trace show` (the capability is `surge_trace`).

use anyhow::Context;
use std::path::PathBuf;
use surge_trace::import::{Format, IostatOptions};
use surge_trace::{Limits, SegmentWriter, Trace};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// Convert blkparse text, a fio iolog or iostat -x output into a surge trace directory.
    #[command(after_long_help = "Examples:\n  blkparse -i sda > sda.txt && surge trace import --format blkparse sda.txt --out sda.trace\n  \
        fio --write_iolog=job.iolog ... && surge trace import --format fio-iolog job.iolog --out job.trace\n  \
        iostat -x -d sda 1 600 > io.txt && surge trace import --format iostat io.txt --out io.trace   (AGGREGATE: rates only)")]
    Import(ImportArgs),
    /// Print a trace's summary (ops, bytes, mix, sizes, sequentiality, idle gaps, bursts) and write an SVG plot.
    Show(ShowArgs),
    /// Issue a trace's requests to an NBD export in real time, paced as `surge plan workload`'s
    /// replay assumes (the trace's order and gaps, at most QD in flight, flushes after what is in flight).
    #[command(after_long_help = "Example:\n  surge trace replay --trace app.trace 'nbd+unix:///app?socket=/run/surge/nbd.sock' --json")]
    Replay(ReplayArgs),
}

#[derive(clap::Args)]
struct ReplayArgs {
    /// The trace (a directory from `surge serve --record` or `surge trace import`).
    #[arg(long)]
    trace: PathBuf,
    /// The export: nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH.
    uri: String,
    /// Requests in flight at most [default: as `surge plan workload`: the most the recording saw in flight, at least 32].
    #[arg(long)]
    qd: Option<usize>,
    /// Print the figures as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct ImportArgs {
    /// blkparse, fio-iolog or iostat.
    #[arg(long)]
    format: String,
    /// The input file (`-`: standard input).
    input: PathBuf,
    /// The trace directory to create.
    #[arg(long)]
    out: PathBuf,
    /// iostat: the device to take (default: the first one reported).
    #[arg(long)]
    device: Option<String>,
    /// iostat: the report interval given to iostat, in seconds.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// iostat: synthesized offsets fall below this size.
    #[arg(long, default_value = "100GiB")]
    device_size: String,
    /// iostat: keep the first report (it averages since boot).
    #[arg(long)]
    keep_first: bool,
}

#[derive(clap::Args)]
struct ShowArgs {
    /// A trace directory (or one segment file).
    trace: PathBuf,
    /// Where to write the SVG plot [default: TRACE.svg beside the trace].
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Do not write a plot.
    #[arg(long)]
    no_plot: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.what {
        What::Import(a) => import(a),
        What::Show(a) => show(a),
        What::Replay(a) => replay(a),
    }
}

fn replay(a: ReplayArgs) -> anyhow::Result<()> {
    let t = Trace::open(&a.trace)?;
    anyhow::ensure!(!t.records.is_empty(), "{}: the trace has no requests", a.trace.display());
    anyhow::ensure!(t.header.timed, "{}: the trace is untimed (no gaps to keep); a real-time replay needs times", a.trace.display());
    let qd = a.qd.unwrap_or_else(|| surge_sim::plan::default_qd(&t));
    let o = crate::load::replay::replay(&t, &a.uri, qd)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&o)?);
    } else {
        println!(
            "{} requests at QD {} in {:.3} s (lag at the end {:.3} s, mean latency {:.0} us; sent at most {:.2} ms late)",
            o.requests, o.qd, o.completion_s, o.final_lag_s, o.mean_latency_us, o.max_send_late_ms
        );
    }
    Ok(())
}

fn import(a: ImportArgs) -> anyhow::Result<()> {
    let format: Format = a.format.parse().map_err(anyhow::Error::msg)?;
    let text = if a.input.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading standard input")?
    } else {
        std::fs::read_to_string(&a.input).with_context(|| format!("reading {}", a.input.display()))?
    };
    let device_size = surge_block::units::parse_size(&a.device_size).map_err(|e| anyhow::anyhow!("--device-size {}: {e}", a.device_size))?;
    let opts = IostatOptions { device: a.device, interval_s: a.interval, device_size, keep_first: a.keep_first, ..Default::default() };
    let t = surge_trace::import::import(format, &text, &opts).with_context(|| format!("importing {}", a.input.display()))?;
    // An import is kept whole: one bound as large as the input needs.
    let limits = Limits { segment_bytes: 64 << 20, max_bytes: u64::MAX };
    let mut w = SegmentWriter::create(&a.out, t.header.clone(), limits)?;
    for r in &t.records {
        w.push(r)?;
    }
    let bytes = w.finish()?;
    println!("{} requests from {} -> {} ({bytes} bytes){}", t.records.len(), a.input.display(), a.out.display(), if t.header.aggregate { "; AGGREGATE: synthesized from averages" } else { "" });
    Ok(())
}

fn show(a: ShowArgs) -> anyhow::Result<()> {
    let t = Trace::open(&a.trace)?;
    let s = surge_trace::summary::summarize(&t);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", surge_trace::summary::render(&s));
    }
    if !a.no_plot {
        let svg = a.svg.unwrap_or_else(|| {
            let mut p = a.trace.clone().into_os_string();
            p.push(".svg");
            PathBuf::from(p)
        });
        surge_trace::plot::svg(&t, &svg).map_err(anyhow::Error::msg)?;
        if !a.json {
            println!("plot: {}", svg.display());
        }
    }
    Ok(())
}
