//! Subcommands, one module each: `Args` (clap) and `run(args) -> anyhow::Result<()>`.

pub mod bb;
pub mod cloud;
pub mod experiment;
pub mod load;
pub mod plan;
pub mod qos;
pub mod serve;
pub mod set;
pub mod sim;
pub mod status;
pub mod stripe_bench;
pub mod top;
pub mod torture;
pub mod trace;
