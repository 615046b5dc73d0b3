//! Weekly time windows (some days of the week, from a time of day to another, in a time
//! zone): when a sync's bandwidth limit applies. Shared by the job service, which checks
//! the clock against them as a sync goes, and the operator, which refuses a BackupSchedule
//! whose windows the service would refuse.

use chrono::{DateTime, Datelike, Timelike, Utc};
use chrono_tz::Tz;
use ferry_core::{Error, Result};

use crate::parse_zone;

const MINUTES_PER_DAY: u32 = 24 * 60;
/// The day names, Monday first.
pub const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/// Some days of the week, from a time of day to another, in a time zone.
#[derive(Debug, Clone, PartialEq)]
pub struct WeeklyWindow {
    /// Monday first.
    days: [bool; 7],
    /// Minutes after midnight; `end <= start` runs past midnight into the next day.
    start: u32,
    end: u32,
    zone: Tz,
}

impl WeeklyWindow {
    /// Parses a window: `days` from `mon` to `sun` (empty: every day), `start` and `end`
    /// as `HH:MM` (`24:00` only as an end; an end at or before the start runs past
    /// midnight), `zone` an IANA name (empty: UTC). Errors name `field` and its part.
    pub fn parse(
        field: &str,
        days: &[impl AsRef<str>],
        start: &str,
        end: &str,
        zone: &str,
    ) -> Result<Self> {
        let mut on = [days.is_empty(); 7];
        for d in days {
            let d = d.as_ref();
            let at = DAYS
                .iter()
                .position(|n| n.eq_ignore_ascii_case(d.trim()))
                .ok_or_else(|| {
                    Error::invalid_input(format!(
                        "{field}.days: '{d}' is not a day (mon, tue, wed, thu, fri, sat, sun)"
                    ))
                })?;
            on[at] = true;
        }
        let start = time_of_day(&format!("{field}.start"), start, false)?;
        let end = time_of_day(&format!("{field}.end"), end, true)?;
        let zone = parse_zone(zone)
            .map_err(|e| Error::invalid_input(format!("{field}.{}", e.message())))?;
        Ok(Self {
            days: on,
            start,
            end,
            zone,
        })
    }

    /// Whether `now` is inside the window. A window past midnight belongs to the day it
    /// starts on.
    pub fn contains(&self, now: DateTime<Utc>) -> bool {
        let local = now.with_timezone(&self.zone);
        let day = local.weekday().num_days_from_monday() as usize;
        let minute = local.hour() * 60 + local.minute();
        if self.start < self.end {
            return self.days[day] && (self.start..self.end).contains(&minute);
        }
        let yesterday = (day + 6) % 7;
        (self.days[day] && minute >= self.start) || (self.days[yesterday] && minute < self.end)
    }
}

/// `HH:MM` as minutes after midnight; `24:00` only as an end.
fn time_of_day(what: &str, text: &str, end: bool) -> Result<u32> {
    let bad = || {
        Error::invalid_input(format!(
            "{what} '{text}' is not a time of day: give HH:MM, like 08:00"
        ))
    };
    let (h, m) = text.trim().split_once(':').ok_or_else(bad)?;
    if h.is_empty() || h.len() > 2 || m.len() != 2 {
        return Err(bad());
    }
    let (h, m): (u32, u32) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    let minutes = h * 60 + m;
    if m >= 60 || minutes > MINUTES_PER_DAY || (minutes == MINUTES_PER_DAY && !end) {
        return Err(bad());
    }
    Ok(minutes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use ferry_core::ErrorKind;

    fn window(days: &[&str], start: &str, end: &str, zone: &str) -> Result<WeeklyWindow> {
        WeeklyWindow::parse("w", days, start, end, zone)
    }

    fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
    }

    #[test]
    fn windows_hold_their_days_and_hours_in_their_time_zone() {
        // 2026-12-07 is a Monday.
        let office = window(&["mon", "tue", "wed", "thu", "fri"], "08:00", "18:00", "").unwrap();
        assert!(office.contains(at(2026, 12, 7, 8, 0)));
        assert!(office.contains(at(2026, 12, 7, 17, 59)));
        assert!(!office.contains(at(2026, 12, 7, 18, 0)));
        assert!(!office.contains(at(2026, 12, 7, 7, 59)));
        assert!(!office.contains(at(2026, 12, 6, 12, 0)), "a Sunday");
        // The night from Friday: Friday 22:00 to Saturday 06:00, not Sunday night.
        let night = window(&["fri"], "22:00", "06:00", "").unwrap();
        assert!(night.contains(at(2026, 12, 11, 23, 0)));
        assert!(night.contains(at(2026, 12, 12, 5, 59)));
        assert!(!night.contains(at(2026, 12, 12, 6, 0)));
        assert!(!night.contains(at(2026, 12, 13, 23, 0)));
        // In Oslo (UTC+1 in December) 08:00 is 07:00 UTC.
        let oslo = window(&[], "08:00", "24:00", "Europe/Oslo").unwrap();
        assert!(oslo.contains(at(2026, 12, 6, 7, 0)));
        assert!(!oslo.contains(at(2026, 12, 6, 6, 59)));
        assert!(oslo.contains(at(2026, 12, 6, 22, 59)));
        assert!(!oslo.contains(at(2026, 12, 6, 23, 0)));
        // Every day, the whole day.
        assert!(window(&[], "00:00", "24:00", "")
            .unwrap()
            .contains(Utc::now()));
    }

    #[test]
    fn bad_windows_are_refused_naming_the_field() {
        for (days, start, end, zone, what) in [
            (&["someday"][..], "08:00", "18:00", "", "w.days"),
            (&[][..], "8", "18:00", "", "w.start"),
            (&[][..], "24:00", "18:00", "", "w.start"),
            (&[][..], "08:00", "18:60", "", "w.end"),
            (&[][..], "08:00", "25:00", "", "w.end"),
            (&[][..], "08:00", "18:00", "Mars/Olympus", "w.time_zone"),
        ] {
            let e = window(days, start, end, zone).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput);
            assert!(e.to_string().contains(what), "{what}: {e}");
        }
    }
}
