//! The `surge` binary: one subcommand per module under `cmd/`.

use clap::{Parser, Subcommand};

mod cloud;
mod cmd;
mod config;
mod control;
mod coop;
mod experiment;
mod load;
mod logging;
mod metrics;
mod recording;
mod reload;
mod stack;
mod torture;

/// surge: elastic, cheap cloud storage throughput.
///
/// surge exports block volumes over NBD and reshapes the storage beneath them
/// as demand changes.
#[derive(Parser)]
#[command(name = "surge", version, about, long_about = None)]
struct Cli {
    /// Log filter (tracing env-filter syntax), e.g. `info`, `surge_nbd=debug`
    /// [default: decisions, warnings and errors; experiments: warnings and errors].
    #[arg(long, global = true, env = "SURGE_LOG")]
    log: Option<String>,
    /// Log lines as text or as JSON objects (one per line, for journald/log shippers).
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: logging::LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Serve(cmd::serve::Args),
    /// Manage cloud volumes (local emulated cloud, or AWS EBS), their cost and orphans.
    Cloud(cmd::cloud::Args),
    Status(cmd::status::Args),
    Top(cmd::top::Args),
    Set(cmd::set::Args),
    /// Show or change tenants' shares of shared pools (`share:` exports).
    Qos(cmd::qos::Args),
    /// Run a self-contained experiment on the local cloud and write a report.
    Experiment(cmd::experiment::Args),
    /// Plan volumes for a capacity and a performance target, or for a recorded workload, at list prices.
    Plan(cmd::plan::Args),
    /// Simulate a fleet of VMs running a recorded workload (virtual time): cost, volumes, API calls vs account limits.
    Sim(cmd::sim::Args),
    /// Block I/O traces: import blkparse / fio iolog / iostat output, show a summary and a plot.
    Trace(cmd::trace::Args),
    /// Kill/restart an export again and again and check that no acknowledged data is lost.
    Torture(cmd::torture::Args),
    Bb(cmd::bb::Args),
    StripeBench(cmd::stripe_bench::Args),
    Load(cmd::load::Args),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Simulations run the policies on virtual time: their decisions are in
    // the printed table, not in log lines stamped with wall-clock time.
    let quiet = matches!(cli.command, Command::Experiment(_) | Command::Top(_) | Command::Plan(_) | Command::Sim(_));
    logging::init(cli.log.as_deref(), cli.log_format, quiet);
    let result = match cli.command {
        Command::Serve(a) => cmd::serve::run(a),
        Command::Cloud(a) => cmd::cloud::run(a),
        Command::Status(a) => cmd::status::run(a),
        Command::Top(a) => cmd::top::run(a),
        Command::Set(a) => cmd::set::run(a),
        Command::Qos(a) => cmd::qos::run(a),
        Command::Experiment(a) => cmd::experiment::run(a),
        Command::Plan(a) => cmd::plan::run(a),
        Command::Trace(a) => cmd::trace::run(a),
        Command::Sim(a) => cmd::sim::run(a),
        Command::Torture(a) => cmd::torture::run(a),
        Command::StripeBench(a) => cmd::stripe_bench::run(a),
        Command::Load(a) => cmd::load::run(a),
        Command::Bb(a) => cmd::bb::run(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("surge: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
