//! Human quantities in specs and flags: sizes, rates and durations. One parser
//! for every crate, so `64MiB` or `5ms` means the same everywhere.

use std::time::Duration;

/// Unit multipliers: K/M/G/T/P and KiB.. are powers of 1024 (as qemu-img and
/// `truncate -s` read them), KB/MB/GB.. are powers of 1000.
fn unit_multiplier(unit: &str) -> Option<u64> {
    const K: u64 = 1024;
    const D: u64 = 1000;
    Some(match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => K,
        "m" | "mib" => K.pow(2),
        "g" | "gib" => K.pow(3),
        "t" | "tib" => K.pow(4),
        "p" | "pib" => K.pow(5),
        "kb" => D,
        "mb" => D.pow(2),
        "gb" => D.pow(3),
        "tb" => D.pow(4),
        "pb" => D.pow(5),
        _ => return None,
    })
}

/// Sizes: `4096`, `512KiB`, `64MiB`, `1GiB`, `100G` (GiB), `10GB` (10^9),
/// `1.5GiB`. Exact integer arithmetic; the result must be a whole number of bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = (&s[..split], s[split..].trim());
    if num.is_empty() {
        return Err("expected a number first".into());
    }
    let mult = unit_multiplier(unit).ok_or_else(|| format!("unknown unit {unit:?}"))? as u128;
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() || frac.contains('.') || frac.len() > 18 {
        return Err("malformed number".into());
    }
    let int: u128 = int.parse().map_err(|_| "number too large".to_string())?;
    let scale = 10u128.pow(frac.len() as u32);
    let frac_v: u128 = if frac.is_empty() { 0 } else { frac.parse().map_err(|_| "malformed number".to_string())? };
    let scaled = int
        .checked_mul(scale)
        .and_then(|v| v.checked_add(frac_v))
        .and_then(|v| v.checked_mul(mult))
        .ok_or("number too large")?;
    if scaled % scale != 0 {
        return Err("not a whole number of bytes".into());
    }
    u64::try_from(scaled / scale).map_err(|_| "number too large".into())
}

/// Rates in bytes per second: `33MB/s`, `128MiB/s`, `1GiB/s` (`/s` required).
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let q = s.trim().strip_suffix("/s").ok_or("a rate ends in /s, e.g. 33MB/s")?;
    match parse_size(q)? {
        0 => Err("a rate must be positive".into()),
        v => Ok(v),
    }
}

/// Durations: `5ms`, `200us`, `1.5s`, `2m`, `0`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("{s:?}: expected a duration like 5ms, 200us or 1s"))?;
    let secs = match unit.trim() {
        "ns" => n / 1e9,
        "us" | "µs" => n / 1e6,
        "ms" => n / 1e3,
        "s" => n,
        "m" | "min" => n * 60.0,
        "" if n == 0.0 => 0.0,
        u => return Err(format!("{s:?}: unknown unit {u:?} (use ns, us, ms, s, m)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{s:?}: duration out of range"))
}

/// Largest binary unit that divides the size exactly, e.g. `64MiB`, `1536KiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["PiB", "TiB", "GiB", "MiB", "KiB"];
    for (i, u) in UNITS.iter().enumerate() {
        let m = 1u64 << (10 * (5 - i));
        if bytes >= m && bytes % m == 0 {
            return format!("{}{u}", bytes / m);
        }
    }
    format!("{bytes}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_use_binary_short_units_and_decimal_b_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size("100G"), Ok(100 << 30));
        assert_eq!(parse_size("10GB"), Ok(10_000_000_000));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        for bad in ["", "GiB", "1.2.3G", "5XB", "0.3B", "99999999999999999999P"] {
            assert!(parse_size(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn rates_need_a_per_second_suffix_and_a_positive_value() {
        assert_eq!(parse_rate("33MB/s"), Ok(33_000_000));
        assert!(parse_rate("33MB").is_err());
        assert!(parse_rate("0/s").is_err());
    }

    #[test]
    fn durations_take_fractions_and_units() {
        assert_eq!(parse_duration("5ms"), Ok(Duration::from_millis(5)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5h").is_err());
    }

    #[test]
    fn format_size_picks_the_largest_exact_unit() {
        assert_eq!(format_size(64 << 20), "64MiB");
        assert_eq!(format_size(1536 << 10), "1536KiB");
        assert_eq!(format_size(1000), "1000B");
    }
}
