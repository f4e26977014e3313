//! Human-readable sizes (`128M`, `1G`) and durations (`500ms`, `10s`).

use std::time::Duration;

/// Why a size or duration string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?}: {reason}")]
pub struct UnitError {
    /// The text as given.
    pub input: String,
    /// What is wrong and what is allowed.
    pub reason: &'static str,
}

fn err(input: &str, reason: &'static str) -> UnitError {
    UnitError {
        input: input.to_owned(),
        reason,
    }
}

/// Splits `"128M"` into `("128", "M")`; the number may have a fraction (`"0.5G"`).
fn split_number(s: &str) -> (&str, &str) {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    s.split_at(end)
}

/// Parses a byte size: a number with an optional binary suffix `K`, `M`, `G`, `T`
/// (also `KiB`, `MB`…: all suffixes are powers of 1024), or a plain byte count.
pub fn parse_size(input: &str) -> Result<u64, UnitError> {
    const WHAT: &str = "expected a size like 512K, 128M or 1G (powers of 1024), or a byte count";
    let s = input.trim();
    let (num, suffix) = split_number(s);
    if num.is_empty() {
        return Err(err(input, WHAT));
    }
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(err(input, WHAT)),
    };
    let value: f64 = num.parse().map_err(|_| err(input, WHAT))?;
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(err(input, "size is too large"));
    }
    Ok(bytes as u64)
}

/// Parses a duration: a number with a unit `ms`, `s`, `m` or `h` (`500ms`, `2.5s`,
/// `1m`); a bare number means seconds.
pub fn parse_duration(input: &str) -> Result<Duration, UnitError> {
    const WHAT: &str = "expected a duration like 500ms, 10s or 2m";
    let s = input.trim();
    let (num, unit) = split_number(s);
    if num.is_empty() {
        return Err(err(input, WHAT));
    }
    let value: f64 = num.parse().map_err(|_| err(input, WHAT))?;
    let secs = match unit.trim() {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(err(input, WHAT)),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| err(input, "duration is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("128M").unwrap(), 128 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("1gib").unwrap(), 1 << 30);
        assert_eq!(parse_size("0.5K").unwrap(), 512);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        for bad in ["", "M", "12X", "-1M", "1.2.3M", "99999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        for bad in ["", "s", "10 parsecs", "-5s", "1e400s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn size_round_trip() {
        for n in [0u64, 1, 1023, 1 << 20, (1 << 30) + 7, u32::MAX as u64] {
            assert_eq!(parse_size(&n.to_string()).unwrap(), n);
        }
    }
}
