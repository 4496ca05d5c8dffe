//! The `surge` binary: one subcommand per module under `cmd/`.

use clap::{Parser, Subcommand};

mod cmd;
mod config;
mod control;
mod coop;
mod experiment;
mod stack;
mod torture;

/// surge: elastic, cheap cloud storage throughput.
///
/// surge exports block volumes over NBD and reshapes the storage beneath them
/// as demand changes.
#[derive(Parser)]
#[command(name = "surge", version, about, long_about = None)]
struct Cli {
    /// Log filter (tracing env-filter syntax), e.g. `info`, `surge_nbd=debug`.
    #[arg(long, global = true, env = "SURGE_LOG", default_value = "info")]
    log: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Serve(cmd::serve::Args),
    /// Manage volumes of the local emulated cloud and what they cost.
    Cloud(cmd::cloud::Args),
    Status(cmd::status::Args),
    Set(cmd::set::Args),
    /// Show or change tenants' shares of shared pools (`share:` exports).
    Qos(cmd::qos::Args),
    /// Run a self-contained experiment on the local cloud and write a report.
    Experiment(cmd::experiment::Args),
    /// Kill/restart an export again and again and check that no acknowledged data is lost.
    Torture(cmd::torture::Args),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&cli.log).unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match cli.command {
        Command::Serve(a) => cmd::serve::run(a),
        Command::Cloud(a) => cmd::cloud::run(a),
        Command::Status(a) => cmd::status::run(a),
        Command::Set(a) => cmd::set::run(a),
        Command::Qos(a) => cmd::qos::run(a),
        Command::Experiment(a) => cmd::experiment::run(a),
        Command::Torture(a) => cmd::torture::run(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("surge: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
