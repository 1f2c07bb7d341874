//! Provides `Retry-After` parsing: delay seconds or an HTTP date.

use super::*;

/// A `Retry-After` value (delay seconds, or an IMF-fixdate HTTP date) as a wait from `now`.
/// Anything else is ignored.
pub(super) fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = parse_http_date(value)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Parses an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the form HTTP/1.1 senders must
/// use; the obsolete forms are not accepted.
pub(super) fn parse_http_date(value: &str) -> Option<SystemTime> {
    pub(super) const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let parts: Vec<&str> = value.split_ascii_whitespace().collect();
    let [weekday, day, month, year, time, zone] = parts.as_slice() else {
        return None;
    };
    if !weekday.ends_with(',') || *zone != "GMT" {
        return None;
    }
    let day: u32 = day.parse().ok().filter(|day| (1..=31).contains(day))?;
    let month = MONTHS.iter().position(|name| name == month)?;
    let month = u32::try_from(month).ok()?.checked_add(1)?;
    let year: i64 = year.parse().ok().filter(|year| (1..=9999).contains(year))?;
    let clock: Vec<&str> = time.split(':').collect();
    let [hour, minute, second] = clock.as_slice() else {
        return None;
    };
    let hour: i64 = hour.parse().ok().filter(|hour| (0..24).contains(hour))?;
    let minute: i64 = minute
        .parse()
        .ok()
        .filter(|minute| (0..60).contains(minute))?;
    let second: i64 = second
        .parse()
        .ok()
        .filter(|second| (0..=60).contains(second))?;
    let days = days_from_civil(year, month, day);
    let seconds = days
        .checked_mul(86_400)?
        .checked_add(hour * 3_600 + minute * 60 + second)?;
    let seconds = u64::try_from(seconds).ok()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(seconds))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
pub(super) fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = (i64::from(month) + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

// ---------------------------------------------------------------------------------------------
// Server-sent events.
// ---------------------------------------------------------------------------------------------
