//! `surge serve` (being written).

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("surge serve is not implemented yet")
}
