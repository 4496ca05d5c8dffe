//! Experiments: one module each, run by `surge experiment NAME`.

pub mod fairshare;
pub mod elastic;
pub mod progress;
