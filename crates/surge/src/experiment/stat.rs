//! Median and range of one figure over the runs of an approach (the reports'
//! "median (min-max)").

use serde::Serialize;

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Stat {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Stat {
    /// Of `v` (NaN for no runs).
    pub fn of(mut v: Vec<f64>) -> Stat {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n == 0 {
            f64::NAN
        } else if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Stat { median, min: v.first().copied().unwrap_or(f64::NAN), max: v.last().copied().unwrap_or(f64::NAN) }
    }
}
