//! Subcommands, one module each: `Args` (clap) and `run(args) -> anyhow::Result<()>`.

pub mod serve;
pub mod experiment;
