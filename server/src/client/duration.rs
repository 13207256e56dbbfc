//! Durations as people type them on a command line (`90`, `90s`, `90m`, `2h`, `1h30m`, `1d`)
//! and as the client prints them back (`1h05m`).

use std::time::Duration;

/// Parses a duration: plain seconds, or numbers each followed by `d`, `h`, `m` or `s`, largest
/// unit first (`1h30m`). Zero is refused: no limit is ever meant to be zero.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration; say e.g. 90 (seconds), 90m or 2h".to_owned());
    }
    if let Ok(seconds) = text.parse::<u64>() {
        return nonzero(seconds, text);
    }
    let mut total: u64 = 0;
    let mut digits = String::new();
    let mut last_unit = u64::MAX;
    for c in text.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            'd' => 86_400,
            'h' => 3_600,
            'm' => 60,
            's' => 1,
            _ => return Err(format!("`{text}`: unknown unit `{c}`; use d, h, m or s (e.g. 90m, 1h30m)")),
        };
        // `30m1h` is almost certainly a typo, and `1h1h` surely one.
        if digits.is_empty() || unit >= last_unit {
            return Err(format!("`{text}` is not a duration; say e.g. 90 (seconds), 90m, 2h or 1h30m"));
        }
        let n: u64 = digits.parse().map_err(|_| format!("`{text}` is too long a duration"))?;
        total = n
            .checked_mul(unit)
            .and_then(|s| total.checked_add(s))
            .ok_or_else(|| format!("`{text}` is too long a duration"))?;
        digits.clear();
        last_unit = unit;
    }
    if !digits.is_empty() {
        return Err(format!("`{text}` ends in a number without a unit; say e.g. 1h30m, not 1h30"));
    }
    nonzero(total, text)
}

fn nonzero(seconds: u64, text: &str) -> Result<Duration, String> {
    if seconds == 0 {
        return Err(format!("`{text}` is zero; a duration must be at least one second"));
    }
    Ok(Duration::from_secs(seconds))
}

/// A duration for people: `45s`, `12m`, `1h05m`, `3d04h`. Precise to the second below a
/// minute and to the minute below a day; past that, hours are enough.
pub fn human(seconds: i64) -> String {
    let s = seconds.unsigned_abs();
    match s {
        0..60 => format!("{s}s"),
        60..3_600 => format!("{}m", s / 60),
        3_600..86_400 => match (s % 3_600) / 60 {
            0 => format!("{}h", s / 3_600),
            m => format!("{}h{m:02}m", s / 3_600),
        },
        _ => match (s % 86_400) / 3_600 {
            0 => format!("{}d", s / 86_400),
            h => format!("{}d{h:02}h", s / 86_400),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_numbers_are_seconds_and_units_add_up() {
        let secs = |t: &str| parse(t).map(|d| d.as_secs());
        assert_eq!(secs("90"), Ok(90));
        assert_eq!(secs("90s"), Ok(90));
        assert_eq!(secs("90m"), Ok(5_400));
        assert_eq!(secs("2h"), Ok(7_200));
        assert_eq!(secs("1h30m"), Ok(5_400));
        assert_eq!(secs("1d2h3m4s"), Ok(93_784));
        assert_eq!(secs(" 5m "), Ok(300));
    }

    #[test]
    fn a_duration_that_could_be_misread_is_refused_with_a_hint() {
        for bad in ["", "0", "0m", "1h30", "30m1h", "1h1h", "m", "5 m", "1.5h", "2w", "-5", "99999999999999999999d"] {
            let error = parse(bad).expect_err(bad);
            assert!(!error.is_empty(), "{bad}");
        }
        assert!(parse("1h30").unwrap_err().contains("without a unit"));
        assert!(parse("2w").unwrap_err().contains("unknown unit"));
    }

    #[test]
    fn durations_print_at_the_precision_people_read() {
        assert_eq!(human(0), "0s");
        assert_eq!(human(45), "45s");
        assert_eq!(human(-45), "45s");
        assert_eq!(human(720), "12m");
        assert_eq!(human(3_600), "1h");
        assert_eq!(human(3_900), "1h05m");
        assert_eq!(human(86_400 * 3 + 3_600 * 4 + 59), "3d04h");
    }
}
