//! `surge load`: drive a volume over NBD (the logic is in `crate::load`).

pub use crate::load::LoadConfig as Args;

pub fn run(a: Args) -> anyhow::Result<()> {
    crate::load::run(&a)?.print()
}
