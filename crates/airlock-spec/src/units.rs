//! Human-readable sizes (`128M`, `1GiB`) and durations (`500ms`, `10s`), parsed and
//! printed by one rule everywhere (CLI flags, API and MCP messages).
//!
//! A bare number is refused (except `0`, which means the same in every unit): `--memory 10`
//! could be read as bytes or as megabytes, `--timeout 5` as seconds or as milliseconds
//! (the API's field is `timeout_ms`). The error says which units are allowed. Printing
//! uses the largest unit that divides the value exactly, so a limit comes back in the
//! unit it was given in (`64 MiB`, `10 s`), never as `67108864 byte`.

use std::time::Duration;

/// Why a size or duration string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?}: {reason}")]
pub struct UnitError {
    /// The text as given.
    pub input: String,
    /// What is wrong and what is allowed.
    pub reason: String,
}

fn err(input: &str, reason: impl Into<String>) -> UnitError {
    UnitError {
        input: input.to_owned(),
        reason: reason.into(),
    }
}

/// The size units, for messages.
const SIZE_UNITS: &str = "K, M, G or T (powers of 1024; KiB, MiB… and KB, MB… mean the same), or B for bytes";
/// The duration units, for messages.
const DURATION_UNITS: &str = "ms, s, m (minutes) or h";

/// Splits `"128M"` into `("128", "M")`; the number may have a fraction (`"0.5G"`).
fn split_number(s: &str) -> (&str, &str) {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    s.split_at(end)
}

/// Whether a bare number is zero (`0`, `0.0`): unambiguous in every unit.
fn is_zero(num: &str) -> bool {
    num.parse::<f64>().is_ok_and(|v| v == 0.0)
}

/// Parses a byte size: a number with a unit `K`, `M`, `G`, `T` (also `KiB`, `MB`…: all
/// are powers of 1024) or `B` for bytes. A bare number other than `0` is refused: it is
/// ambiguous.
pub fn parse_size(input: &str) -> Result<u64, UnitError> {
    let s = input.trim();
    if s.starts_with('-') {
        return Err(err(input, "a size cannot be negative"));
    }
    let (num, suffix) = split_number(s);
    if num.is_empty() {
        return Err(err(
            input,
            format!("not a size: give a number and a unit, e.g. 64M or 64MiB; units: {SIZE_UNITS}"),
        ));
    }
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" if is_zero(num) => 0,
        "" => {
            return Err(err(
                input,
                format!(
                    "a bare number is ambiguous: give a unit, e.g. {num}M or {num}MiB for mebibytes, {num}B for bytes; units: {SIZE_UNITS}"
                ),
            ));
        }
        "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        other => {
            return Err(err(
                input,
                format!("unknown unit {other:?}: use {SIZE_UNITS} (e.g. 64M)"),
            ));
        }
    };
    let value: f64 = num
        .parse()
        .map_err(|_| err(input, format!("{num:?} is not a number (e.g. 64M, 1.5G)")))?;
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(err(input, "size is too large"));
    }
    Ok(bytes as u64)
}

/// Parses a duration: a number with a unit `ms`, `s`, `m` (or `min`) or `h` (`500ms`,
/// `2.5s`, `1m`). A bare number other than `0` is refused: seconds or milliseconds?
pub fn parse_duration(input: &str) -> Result<Duration, UnitError> {
    let s = input.trim();
    if s.starts_with('-') {
        return Err(err(input, "a duration cannot be negative"));
    }
    let (num, unit) = split_number(s);
    if num.is_empty() {
        return Err(err(
            input,
            format!(
                "not a duration: give a number and a unit, e.g. 500ms, 10s or 2m; units: {DURATION_UNITS}"
            ),
        ));
    }
    let value: f64 = num
        .parse()
        .map_err(|_| err(input, format!("{num:?} is not a number (e.g. 10s, 1.5s)")))?;
    let secs = match unit.trim() {
        "" if value == 0.0 => 0.0,
        "" => {
            return Err(err(
                input,
                format!(
                    "a bare number is ambiguous: give a unit, e.g. {num}s for seconds or {num}ms for milliseconds; units: {DURATION_UNITS}"
                ),
            ));
        }
        "ms" => value / 1000.0,
        "s" => value,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(err(
                input,
                format!("unknown unit {other:?}: use {DURATION_UNITS} (e.g. 10s)"),
            ));
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|_| err(input, "duration is out of range"))
}

/// A byte count in the largest binary unit that divides it exactly: `64 MiB`, `1 GiB`,
/// `1536 MiB`, `1000 bytes`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(u32, &str); 4] = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
    for (shift, unit) in UNITS {
        let size = 1u64 << shift;
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    if bytes == 1 {
        "1 byte".to_owned()
    } else {
        format!("{bytes} bytes")
    }
}

/// A byte count for a person: in the largest binary unit it reaches, exact when the
/// unit divides it (`64 MiB`), else to one decimal (`14.3 MiB`); small counts in bytes.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [(u32, &str); 4] = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
    for (shift, unit) in UNITS {
        let size = 1u64 << shift;
        if bytes >= size {
            return if bytes.is_multiple_of(size) {
                format!("{} {unit}", bytes >> shift)
            } else {
                format!("{:.1} {unit}", bytes as f64 / size as f64)
            };
        }
    }
    if bytes == 1 {
        "1 byte".to_owned()
    } else {
        format!("{bytes} bytes")
    }
}

/// A duration in the largest unit that divides it exactly: `10 s`, `500 ms`, `2 min`,
/// `24 h` (below a millisecond: `µs`).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if !d.subsec_nanos().is_multiple_of(1_000_000) {
        return format!("{} µs", d.as_micros());
    }
    format_ms(ms.try_into().unwrap_or(u64::MAX))
}

/// [`format_duration`] of a count of milliseconds (`timeout_ms`).
pub fn format_ms(ms: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(3_600_000, "h"), (60_000, "min"), (1000, "s")];
    for (size, unit) in UNITS {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{} {unit}", ms / size);
        }
    }
    format!("{ms} ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("128M").unwrap(), 128 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("1gib").unwrap(), 1 << 30);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("0.5K").unwrap(), 512);
        assert_eq!(parse_size("4096B").unwrap(), 4096);
        assert_eq!(parse_size("0").unwrap(), 0);
        for bad in ["", "M", "12X", "-1M", "1.2.3M", "99999999999T", "-1"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_bare_size_is_ambiguous_and_says_which_units() {
        let e = parse_size("10").unwrap_err();
        assert!(e.reason.contains("ambiguous"), "{e}");
        assert!(e.reason.contains("10M") && e.reason.contains("10B"), "{e}");
        assert!(e.reason.contains("MiB"), "{e}");
        let e = parse_size("-1").unwrap_err();
        assert!(e.reason.contains("negative"), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        for bad in ["", "s", "10 parsecs", "-5s", "1e400s", "-1", "2"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        let e = parse_duration("5").unwrap_err();
        assert!(e.reason.contains("5s") && e.reason.contains("5ms"), "{e}");
        let e = parse_duration("-1").unwrap_err();
        assert!(e.reason.contains("negative"), "{e}");
    }

    #[test]
    fn printed_in_the_unit_given() {
        assert_eq!(format_size(64 << 20), "64 MiB");
        assert_eq!(format_size(1536 << 20), "1536 MiB");
        assert_eq!(format_size(1 << 40), "1 TiB");
        assert_eq!(format_size(1000), "1000 bytes");
        assert_eq!(format_size(1), "1 byte");
        assert_eq!(format_ms(10_000), "10 s");
        assert_eq!(format_ms(4500), "4500 ms");
        assert_eq!(format_ms(120_000), "2 min");
        assert_eq!(format_duration(Duration::from_secs(86400)), "24 h");
        for s in ["64M", "1G", "512K", "3T", "100B"] {
            let n = parse_size(s).unwrap();
            assert_eq!(
                parse_size(&format_size(n).replace(' ', "").replace("bytes", "B")).unwrap(),
                n
            );
        }
    }

    #[test]
    fn sizes_read_as_a_person_would_write_them() {
        assert_eq!(human_size(64 << 20), "64 MiB");
        assert_eq!(human_size(100 << 20), "100 MiB");
        assert_eq!(human_size(15_000_000), "14.3 MiB");
        assert_eq!(human_size(1 << 30), "1 GiB");
        assert_eq!(human_size(1536), "1.5 KiB");
        assert_eq!(human_size(1000), "1000 bytes");
        assert_eq!(human_size(1), "1 byte");
    }
}
