//! Sizes and durations as the policy writes them, and as reviewers read them back.
//!
//! Sizes are an integer with an IEC suffix (`B`, `KiB`, `MiB`, `GiB`, `TiB`), stored as bytes;
//! durations an integer with `ms`, `s`, `m` or `h`, stored as milliseconds. Decimal SI
//! suffixes (`MB`) are refused rather than guessed at: `512MB` and `512MiB` differ by 5 %.

const SIZE_UNITS: [(&str, u64); 5] = [
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
    ("B", 1),
];

const DURATION_UNITS: [(&str, u64); 4] = [("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)];

fn split_number(text: &str) -> Option<(u64, &str)> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let number = text[..digits].parse().ok()?;
    Some((number, text[digits..].trim_start_matches(' ')))
}

fn parse_with(
    text: &str,
    units: &[(&str, u64)],
    kind: &str,
    suffixes: &str,
) -> Result<u64, String> {
    let bad = || format!("{text:?} is not a {kind}; write an integer with {suffixes}");
    let (number, unit) = split_number(text).ok_or_else(bad)?;
    let (_, factor) = units.iter().find(|(u, _)| *u == unit).ok_or_else(bad)?;
    number
        .checked_mul(*factor)
        .ok_or_else(|| format!("{text:?} overflows 64 bits"))
}

/// Parse `"512MiB"` into bytes.
///
/// # Errors
/// A message saying what a size looks like.
pub fn parse_size(text: &str) -> Result<u64, String> {
    parse_with(text, &SIZE_UNITS, "size", "B, KiB, MiB, GiB or TiB")
}

/// Parse `"90s"` into milliseconds.
///
/// # Errors
/// A message saying what a duration looks like.
pub fn parse_duration(text: &str) -> Result<u64, String> {
    parse_with(text, &DURATION_UNITS, "duration", "ms, s, m or h")
}

/// Parse a CPU count such as `2` or `"1.5"` into thousandths of a CPU.
///
/// # Errors
/// A message saying what a CPU count looks like.
pub fn parse_millis(text: &str) -> Result<u64, String> {
    let bad = || format!("{text:?} is not a CPU count; write a number with at most 3 decimals");
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty()
        || frac.len() > 3
        || !(whole
            .bytes()
            .chain(frac.bytes())
            .all(|b| b.is_ascii_digit()))
    {
        return Err(bad());
    }
    let whole: u64 = whole.parse().map_err(|_| bad())?;
    let frac: u64 = format!("{frac:0<3}").parse().map_err(|_| bad())?;
    whole
        .checked_mul(1000)
        .and_then(|w| w.checked_add(frac))
        .ok_or_else(bad)
}

fn format_with(n: u64, units: &[(&str, u64)], sep: &str) -> String {
    for (unit, factor) in units {
        if n >= *factor && n.is_multiple_of(*factor) {
            return format!("{}{sep}{unit}", n / factor);
        }
    }
    let (smallest, _) = units[units.len() - 1];
    format!("{n}{sep}{smallest}")
}

/// Bytes in the largest unit that divides them exactly: `4 GiB`, `1536 KiB`, `7 B`.
#[must_use]
pub fn format_size(bytes: u64) -> String {
    format_with(bytes, &SIZE_UNITS, " ")
}

/// Milliseconds in the largest unit that divides them exactly: `10m`, `90s`, `1500ms`.
#[must_use]
pub fn format_duration(ms: u64) -> String {
    format_with(ms, &DURATION_UNITS, "")
}

/// Thousandths as a decimal: `1500` → `1.5`.
#[must_use]
pub fn format_millis(millis: u64) -> String {
    let (whole, frac) = (millis / 1000, millis % 1000);
    if frac == 0 {
        whole.to_string()
    } else {
        format!("{whole}.{}", format!("{frac:03}").trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_format_exactly() {
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("4 GiB"), Ok(4 << 30));
        assert_eq!(parse_size("0B"), Ok(0));
        assert_eq!(format_size(4 << 30), "4 GiB");
        assert_eq!(format_size(1536 << 10), "1536 KiB");
        assert_eq!(format_size(7), "7 B");
        assert_eq!(format_size(0), "0 B");
        for bad in ["512MB", "MiB", "1.5GiB", "-1B", "", "99999999999TiB"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_parse_and_format_exactly() {
        assert_eq!(parse_duration("90s"), Ok(90_000));
        assert_eq!(parse_duration("10m"), Ok(600_000));
        assert_eq!(parse_duration("250ms"), Ok(250));
        assert_eq!(format_duration(5_400_000), "90m");
        assert_eq!(format_duration(1500), "1500ms");
        for bad in ["90", "1.5s", "s", "10d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cpu_counts_are_thousandths() {
        assert_eq!(parse_millis("2"), Ok(2000));
        assert_eq!(parse_millis("1.5"), Ok(1500));
        assert_eq!(parse_millis("0.125"), Ok(125));
        assert_eq!(format_millis(1500), "1.5");
        assert_eq!(format_millis(2000), "2");
        for bad in ["1.2345", ".5", "1,5", "x"] {
            assert!(parse_millis(bad).is_err(), "{bad}");
        }
    }
}
