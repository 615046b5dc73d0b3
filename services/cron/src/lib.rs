//! Cron expressions in a time zone: parsing (five fields or a macro such as `@daily`) and
//! the fire times after an instant, in real-time order across daylight saving changes.
//!
//! croner does the calendar search and the daylight saving rules (a fixed time in a
//! skipped hour runs right after the gap; in a repeated hour it runs once, in the first
//! pass; expressions with ranges or steps in the time fields run in both passes). Its
//! search walks wall-clock time, and around a repeated hour the next wall time is not
//! always the next instant (a later pass of an earlier wall time can come first);
//! [`CronSpec::next_after`] turns its answers into the next instant that is really later.
//! [`WeeklyWindow`] is the other question a schedule asks of the clock: is it now inside
//! some days' hours (a sync's bandwidth window)?

#![forbid(unsafe_code)]

use std::str::FromStr;

use chrono::{DateTime, LocalResult, Offset, SubsecRound, TimeDelta, TimeZone, Utc};
pub use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::{Cron, JobType};
use ferry_core::{Error, Result};

mod window;
pub use window::{WeeklyWindow, DAYS};

/// Longest cron expression accepted.
pub const MAX_CRON_BYTES: usize = 256;
/// Longest time zone name accepted (IANA names are at most about 30 bytes).
const MAX_ZONE_BYTES: usize = 64;
/// Wall-clock occurrences one search may step over near a daylight saving change.
const MAX_STEPS: usize = 4096;
/// Longer than any repeated or skipped stretch of wall time a time zone has had.
const DST_WINDOW: TimeDelta = TimeDelta::hours(3);

/// A parsed cron expression with its time zone.
#[derive(Debug, Clone)]
pub struct CronSpec {
    cron: Cron,
    zone: Tz,
    /// A fixed time of day: runs once in a repeated hour.
    fixed: bool,
}

/// The time zone of a name: UTC when empty.
pub fn parse_zone(name: &str) -> Result<Tz> {
    if name.is_empty() {
        return Ok(Tz::UTC);
    }
    if name.len() > MAX_ZONE_BYTES {
        return Err(Error::invalid_input(format!(
            "time_zone is longer than {MAX_ZONE_BYTES} bytes"
        )));
    }
    Tz::from_str(name).map_err(|_| {
        Error::invalid_input(format!(
            "time_zone '{name}' is not an IANA time zone name: use one like UTC, \
             Europe/Oslo or America/New_York"
        ))
    })
}

impl CronSpec {
    /// Parses `expr` in the time zone `zone` (an IANA name; empty is UTC). With
    /// `seconds`, a sixth leading field for seconds is accepted too (a test hook of the
    /// server, never offered through the API).
    pub fn parse(expr: &str, zone: &str, seconds: bool) -> Result<Self> {
        let zone = parse_zone(zone)?;
        let expr = expr.trim();
        if expr.is_empty() {
            return Err(Error::invalid_input(
                "cron is empty: give five fields (minute hour day-of-month month \
                 day-of-week) or @hourly, @daily, @weekly, @monthly or @yearly",
            ));
        }
        if expr.len() > MAX_CRON_BYTES {
            return Err(Error::invalid_input(format!(
                "cron is longer than {MAX_CRON_BYTES} bytes"
            )));
        }
        let parser = CronParser::builder()
            .seconds(if seconds {
                Seconds::Optional
            } else {
                Seconds::Disallowed
            })
            .year(Year::Disallowed)
            .build();
        let cron = parser.parse(expr).map_err(|e| {
            Error::invalid_input(format!(
                "cron '{expr}' is not valid ({e}): give five fields (minute hour \
                 day-of-month month day-of-week) or @hourly, @daily, @weekly, @monthly \
                 or @yearly"
            ))
        })?;
        let fixed = cron.determine_job_type() == JobType::FixedTime;
        let spec = Self { cron, zone, fixed };
        if spec.next_after(Utc::now()).is_none() {
            return Err(Error::invalid_input(format!(
                "cron '{expr}' never fires (no matching date): check the day and month fields"
            )));
        }
        Ok(spec)
    }

    /// The first fire time strictly after `after` (None: the expression never fires again).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let plain = self.first_after(after);
        if !self.offset_changes_near(after) {
            return plain;
        }
        // Near a change of the UTC offset, a wall time earlier than `after`'s can name a
        // later instant (the second pass of a repeated hour): walk the wall times from
        // before the change as well, and take the earliest instant after `after`.
        let mut best = plain;
        let end = after + DST_WINDOW;
        let mut from = (after - DST_WINDOW)
            .trunc_subsecs(0)
            .with_timezone(&self.zone);
        for _ in 0..MAX_STEPS {
            let Ok(found) = self.cron.find_next_occurrence(&from, false) else {
                break;
            };
            let instants = self.instants(&found);
            if instants.iter().all(|t| *t > end) {
                break;
            }
            for t in instants {
                if t > after && best.is_none_or(|b| t < b) {
                    best = Some(t);
                }
            }
            from = found;
        }
        best
    }

    /// The first fire time after `after` in wall-clock order from `after`'s wall time.
    fn first_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Whole seconds: croner keeps the start's fraction of a second in what it finds.
        let mut from = after.trunc_subsecs(0).with_timezone(&self.zone);
        for _ in 0..MAX_STEPS {
            let found = self.cron.find_next_occurrence(&from, false).ok()?;
            if let Some(next) = self.instants(&found).into_iter().find(|t| *t > after) {
                return Some(next);
            }
            from = found;
        }
        None
    }

    /// The instants a fire time found by croner stands for: inside a repeated hour both
    /// passes, except for a fixed time of day, which runs in the first pass only.
    fn instants(&self, found: &DateTime<Tz>) -> Vec<DateTime<Utc>> {
        match self.zone.from_local_datetime(&found.naive_local()) {
            LocalResult::Ambiguous(first, second) if !self.fixed => {
                vec![first.with_timezone(&Utc), second.with_timezone(&Utc)]
            }
            _ => vec![found.with_timezone(&Utc)],
        }
    }

    /// Whether the zone's UTC offset changes within [`DST_WINDOW`] of `t`.
    fn offset_changes_near(&self, t: DateTime<Utc>) -> bool {
        let offset = |t: DateTime<Utc>| {
            self.zone
                .offset_from_utc_datetime(&t.naive_utc())
                .fix()
                .local_minus_utc()
        };
        offset(t - DST_WINDOW) != offset(t + DST_WINDOW)
    }

    /// The fire times in `[first, until]`, where `first` is itself a fire time: how many
    /// (counted up to `limit`) and the latest (None when `first` is after `until`).
    pub fn due(
        &self,
        first: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: u64,
    ) -> (u64, Option<DateTime<Utc>>) {
        if first > until {
            return (0, None);
        }
        let mut count = 1;
        let mut latest = first;
        while let Some(next) = self.next_after(latest) {
            if next > until {
                return (count, Some(latest));
            }
            count += 1;
            latest = next;
            if count >= limit {
                break;
            }
        }
        // Counting stopped at the limit: the latest fire time comes from a backward search.
        let previous = self
            .cron
            .find_previous_occurrence(&until.with_timezone(&self.zone), true)
            .ok()
            .map(|t| t.with_timezone(&Utc))
            .filter(|t| *t >= latest && *t <= until);
        (count, Some(previous.unwrap_or(latest)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    fn fires(spec: &CronSpec, after: &str, n: usize) -> Vec<String> {
        let mut t = utc(after);
        let mut out = Vec::new();
        for _ in 0..n {
            t = spec.next_after(t).unwrap();
            out.push(t.format("%Y-%m-%dT%H:%M:%SZ").to_string());
        }
        out
    }

    #[test]
    fn a_start_inside_a_second_fires_on_whole_seconds() {
        let spec = CronSpec::parse("*/2 * * * * *", "UTC", true).unwrap();
        let after = utc("2026-03-01T10:00:00Z") + TimeDelta::milliseconds(705);
        let next = spec.next_after(after).unwrap();
        assert_eq!(next, utc("2026-03-01T10:00:02Z"));
    }

    #[test]
    fn five_fields_and_macros_parse() {
        for expr in [
            "*/15 * * * *",
            "0 3 * * MON-FRI",
            "30 2 1 JAN *",
            "@hourly",
            "@daily",
            "@weekly",
            "@monthly",
            "@yearly",
            "@annually",
        ] {
            CronSpec::parse(expr, "", false).unwrap_or_else(|e| panic!("{expr}: {e}"));
        }
        let s = CronSpec::parse("@daily", "", false).unwrap();
        assert_eq!(
            fires(&s, "2025-06-01T12:00:00Z", 2),
            ["2025-06-02T00:00:00Z", "2025-06-03T00:00:00Z"]
        );
        let s = CronSpec::parse("@weekly", "", false).unwrap();
        // 2025-06-01 is a Sunday; @weekly is Sunday midnight.
        assert_eq!(
            fires(&s, "2025-06-01T00:00:00Z", 1),
            ["2025-06-08T00:00:00Z"]
        );
        let s = CronSpec::parse("@monthly", "UTC", false).unwrap();
        assert_eq!(
            fires(&s, "2025-06-15T00:00:00Z", 1),
            ["2025-07-01T00:00:00Z"]
        );
        let s = CronSpec::parse("@yearly", "", false).unwrap();
        assert_eq!(
            fires(&s, "2025-06-15T00:00:00Z", 1),
            ["2026-01-01T00:00:00Z"]
        );
        let s = CronSpec::parse("@hourly", "", false).unwrap();
        assert_eq!(
            fires(&s, "2025-06-15T10:59:59Z", 1),
            ["2025-06-15T11:00:00Z"]
        );
    }

    #[test]
    fn steps_ranges_and_weekdays() {
        let s = CronSpec::parse("*/15 * * * *", "", false).unwrap();
        assert_eq!(
            fires(&s, "2025-06-02T10:07:00Z", 3),
            [
                "2025-06-02T10:15:00Z",
                "2025-06-02T10:30:00Z",
                "2025-06-02T10:45:00Z"
            ]
        );
        // Friday 2025-06-06 18:00 -> Monday.
        let s = CronSpec::parse("0 3 * * MON-FRI", "", false).unwrap();
        assert_eq!(
            fires(&s, "2025-06-06T18:00:00Z", 1),
            ["2025-06-09T03:00:00Z"]
        );
        // Exactly at a fire time: the next one, never the same.
        let s = CronSpec::parse("0 * * * *", "", false).unwrap();
        assert_eq!(
            fires(&s, "2025-06-02T10:00:00Z", 1),
            ["2025-06-02T11:00:00Z"]
        );
    }

    #[test]
    fn invalid_expressions_and_zones_say_what_is_wrong() {
        for (expr, what) in [
            ("", "cron is empty"),
            ("* * * *", "not valid"),
            ("61 * * * *", "not valid"),
            ("* * * * * *", "not valid"),
            ("@every 5m", "not valid"),
            ("0 0 30 2 *", "never fires"),
        ] {
            let e = CronSpec::parse(expr, "", false).unwrap_err();
            assert_eq!(e.kind(), ferry_core::ErrorKind::InvalidInput, "{expr}");
            assert!(e.to_string().contains(what), "{expr}: {e}");
        }
        let e = CronSpec::parse("@daily", "Mars/Olympus_Mons", false).unwrap_err();
        assert!(e.to_string().contains("not an IANA time zone"), "{e}");
        assert_eq!(e.kind(), ferry_core::ErrorKind::InvalidInput);
    }

    #[test]
    fn seconds_only_with_the_test_hook() {
        assert!(CronSpec::parse("*/2 * * * * *", "", false).is_err());
        let s = CronSpec::parse("*/2 * * * * *", "", true).unwrap();
        assert_eq!(
            fires(&s, "2025-06-02T10:00:01Z", 2),
            ["2025-06-02T10:00:02Z", "2025-06-02T10:00:04Z"]
        );
        // Five fields still mean minutes with the hook.
        let s = CronSpec::parse("*/5 * * * *", "", true).unwrap();
        assert_eq!(
            fires(&s, "2025-06-02T10:01:00Z", 1),
            ["2025-06-02T10:05:00Z"]
        );
    }

    #[test]
    fn time_zones_move_the_fire_time() {
        // Oslo is UTC+1 in winter and UTC+2 in summer.
        let s = CronSpec::parse("@daily", "Europe/Oslo", false).unwrap();
        assert_eq!(
            fires(&s, "2025-01-10T12:00:00Z", 1),
            ["2025-01-10T23:00:00Z"]
        );
        assert_eq!(
            fires(&s, "2025-07-10T12:00:00Z", 1),
            ["2025-07-10T22:00:00Z"]
        );
        let s = CronSpec::parse("0 9 * * *", "America/New_York", false).unwrap();
        assert_eq!(
            fires(&s, "2025-01-10T00:00:00Z", 1),
            ["2025-01-10T14:00:00Z"]
        );
        assert_eq!(
            fires(&s, "2025-07-10T00:00:00Z", 1),
            ["2025-07-10T13:00:00Z"]
        );
    }

    #[test]
    fn spring_forward_runs_a_skipped_fixed_time_once_after_the_gap() {
        // Europe/Oslo, 2025-03-30: 02:00 CET jumps to 03:00 CEST (01:00Z).
        // The day before: 02:30 CET (01:30Z); the day of the change: 02:30 does not
        // exist, the run is at 03:00 CEST (01:00Z); the day after: 02:30 CEST (00:30Z).
        let s = CronSpec::parse("30 2 * * *", "Europe/Oslo", false).unwrap();
        assert_eq!(
            fires(&s, "2025-03-28T12:00:00Z", 3),
            [
                "2025-03-29T01:30:00Z",
                "2025-03-30T01:00:00Z",
                "2025-03-31T00:30:00Z"
            ]
        );
        // Hourly: 01:00 CET (00:00Z), then 03:00 CEST (01:00Z); no 02:00 that day.
        let s = CronSpec::parse("0 * * * *", "Europe/Oslo", false).unwrap();
        assert_eq!(
            fires(&s, "2025-03-29T23:30:00Z", 3),
            [
                "2025-03-30T00:00:00Z",
                "2025-03-30T01:00:00Z",
                "2025-03-30T02:00:00Z"
            ]
        );
        // New York, 2025-03-09: 02:00 EST jumps to 03:00 EDT (07:00Z).
        let s = CronSpec::parse("30 2 * * *", "America/New_York", false).unwrap();
        assert_eq!(
            fires(&s, "2025-03-08T12:00:00Z", 2),
            ["2025-03-09T07:00:00Z", "2025-03-10T06:30:00Z"]
        );
    }

    #[test]
    fn fall_back_runs_a_fixed_time_once_and_steps_in_both_passes() {
        // Europe/Oslo, 2025-10-26: 03:00 CEST falls back to 02:00 CET (01:00Z); 02:00 to
        // 02:59 happens twice.
        let s = CronSpec::parse("30 2 * * *", "Europe/Oslo", false).unwrap();
        assert_eq!(
            fires(&s, "2025-10-25T12:00:00Z", 2),
            ["2025-10-26T00:30:00Z", "2025-10-27T01:30:00Z"]
        );
        // From inside the second pass, the first pass's 02:30 is over: next day.
        assert_eq!(
            fires(&s, "2025-10-26T01:10:00Z", 1),
            ["2025-10-27T01:30:00Z"]
        );
        // Every 30 minutes: both passes, in real-time order.
        let s = CronSpec::parse("*/30 * * * *", "Europe/Oslo", false).unwrap();
        assert_eq!(
            fires(&s, "2025-10-25T23:45:00Z", 5),
            [
                "2025-10-26T00:00:00Z", // 02:00 CEST
                "2025-10-26T00:30:00Z", // 02:30 CEST
                "2025-10-26T01:00:00Z", // 02:00 CET
                "2025-10-26T01:30:00Z", // 02:30 CET
                "2025-10-26T02:00:00Z", // 03:00 CET
            ]
        );
        // Starting inside the second pass finds the second pass's next fire.
        assert_eq!(
            fires(&s, "2025-10-26T01:10:00Z", 1),
            ["2025-10-26T01:30:00Z"]
        );
        // New York, 2025-11-02: 02:00 EDT falls back to 01:00 EST (06:00Z).
        let s = CronSpec::parse("30 1 * * *", "America/New_York", false).unwrap();
        assert_eq!(
            fires(&s, "2025-11-01T12:00:00Z", 2),
            ["2025-11-02T05:30:00Z", "2025-11-03T06:30:00Z"]
        );
    }

    #[test]
    fn due_counts_and_finds_the_latest() {
        let s = CronSpec::parse("*/10 * * * *", "", false).unwrap();
        let (n, latest) = s.due(
            utc("2025-06-02T10:00:00Z"),
            utc("2025-06-02T10:35:00Z"),
            100,
        );
        assert_eq!(n, 4);
        assert_eq!(latest, Some(utc("2025-06-02T10:30:00Z")));
        let (n, latest) = s.due(
            utc("2025-06-02T10:00:00Z"),
            utc("2025-06-02T10:00:00Z"),
            100,
        );
        assert_eq!((n, latest), (1, Some(utc("2025-06-02T10:00:00Z"))));
        assert_eq!(
            s.due(utc("2025-06-02T10:10:00Z"), utc("2025-06-02T10:00:00Z"), 9),
            (0, None)
        );
        // Past the counting limit the latest still comes out right.
        let (n, latest) = s.due(utc("2025-06-02T10:00:00Z"), utc("2025-06-03T10:05:00Z"), 10);
        assert_eq!(n, 10);
        assert_eq!(latest, Some(utc("2025-06-03T10:00:00Z")));
    }
}
