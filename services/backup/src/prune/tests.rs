//! Policy tables: each case lists snapshot times (one source unless said), a policy and
//! exactly the times kept.

use super::*;

fn t(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(&format!("{s}Z"))
        .unwrap()
        .to_utc()
}

fn snaps(source: &str, times: &[&str]) -> Vec<SnapshotRef> {
    times
        .iter()
        .map(|s| SnapshotRef {
            id: BackupId::generate(t(s)).unwrap(),
            time: t(s),
            source: source.to_string(),
            protected: false,
        })
        .collect()
}

fn kept(plan: &PrunePlan) -> Vec<String> {
    plan.kept()
        .map(|s| s.time.format("%Y-%m-%dT%H:%M:%S").to_string())
        .collect()
}

const NOW: &str = "2026-12-02T12:00:00";

/// Two weeks or so of history, several snapshots on some days, out of order.
const HISTORY: &[&str] = &[
    "2026-11-30T08:00:00",
    "2026-12-01T09:00:00",
    "2026-12-01T21:00:00",
    "2026-11-30T20:00:00",
    "2026-12-02T06:00:00",
    "2026-12-02T06:30:00",
    "2026-11-23T10:00:00",
    "2026-11-02T10:00:00",
    "2026-10-15T10:00:00",
    "2025-12-31T23:00:00",
];

fn check(times: &[&str], policy: KeepPolicy, expect: &[&str]) {
    let plan = plan(&snaps("vm1", times), &policy, t(NOW));
    assert_eq!(kept(&plan), expect, "{policy:?}");
    assert_eq!(plan.decisions.len(), times.len());
}

#[test]
fn keep_last() {
    check(
        HISTORY,
        KeepPolicy::new().with_last(Keep::Count(3)),
        &[
            "2026-12-02T06:30:00",
            "2026-12-02T06:00:00",
            "2026-12-01T21:00:00",
        ],
    );
}

#[test]
fn keep_last_more_than_there_are() {
    let plan = plan(
        &snaps("vm1", HISTORY),
        &KeepPolicy::new().with_last(Keep::Count(50)),
        t(NOW),
    );
    assert_eq!(plan.kept().count(), HISTORY.len());
}

#[test]
fn keep_hourly_takes_the_newest_of_each_hour() {
    check(
        HISTORY,
        KeepPolicy::new().with_hourly(Keep::Count(3)),
        &[
            "2026-12-02T06:30:00",
            "2026-12-01T21:00:00",
            "2026-12-01T09:00:00",
        ],
    );
}

#[test]
fn keep_daily_takes_the_newest_of_each_day() {
    check(
        HISTORY,
        KeepPolicy::new().with_daily(Keep::Count(3)),
        &[
            "2026-12-02T06:30:00",
            "2026-12-01T21:00:00",
            "2026-11-30T20:00:00",
        ],
    );
}

#[test]
fn counts_left_at_the_end_keep_the_oldest_too() {
    check(
        &[
            "2026-12-02T06:00:00",
            "2026-12-01T06:00:00",
            "2026-12-01T05:00:00",
        ],
        KeepPolicy::new().with_daily(Keep::Count(7)),
        &[
            "2026-12-02T06:00:00",
            "2026-12-01T06:00:00",
            "2026-12-01T05:00:00",
        ],
    );
}

#[test]
fn keep_weekly_uses_iso_weeks_across_the_new_year() {
    // 2020-12-31 (Thursday) and 2021-01-03 (Sunday) are both in ISO week 2020-53;
    // 2021-01-04 (Monday) starts week 2021-01.
    check(
        &[
            "2021-01-04T10:00:00",
            "2021-01-03T10:00:00",
            "2020-12-31T10:00:00",
            "2020-12-20T10:00:00",
        ],
        KeepPolicy::new().with_weekly(Keep::Count(2)),
        &["2021-01-04T10:00:00", "2021-01-03T10:00:00"],
    );
}

#[test]
fn keep_monthly_and_yearly() {
    check(
        HISTORY,
        KeepPolicy::new().with_monthly(Keep::Count(2)),
        &["2026-12-02T06:30:00", "2026-11-30T20:00:00"],
    );
    check(
        HISTORY,
        KeepPolicy::new().with_yearly(Keep::Count(5)),
        &["2026-12-02T06:30:00", "2025-12-31T23:00:00"],
    );
}

#[test]
fn keep_all_of_a_period() {
    check(
        HISTORY,
        KeepPolicy::new().with_monthly(Keep::All),
        &[
            "2026-12-02T06:30:00",
            "2026-11-30T20:00:00",
            "2026-10-15T10:00:00",
            "2025-12-31T23:00:00",
        ],
    );
}

#[test]
fn rules_add_up_and_give_their_reasons() {
    let policy = KeepPolicy::new()
        .with_last(Keep::Count(1))
        .with_daily(Keep::Count(2))
        .with_monthly(Keep::Count(2));
    let plan = plan(&snaps("vm1", HISTORY), &policy, t(NOW));
    assert_eq!(
        kept(&plan),
        [
            "2026-12-02T06:30:00",
            "2026-12-01T21:00:00",
            "2026-11-30T20:00:00"
        ]
    );
    let first = &plan.decisions[0];
    assert_eq!(
        first.reasons,
        vec![KeepReason::Last, KeepReason::Daily, KeepReason::Monthly]
    );
    assert!(plan.decisions[1].reasons.is_empty());
    assert_eq!(plan.decisions[2].reasons, vec![KeepReason::Daily]);
    assert!(plan.decisions[3].reasons.is_empty());
    assert_eq!(plan.decisions[4].reasons, vec![KeepReason::Monthly]);
    assert_eq!(KeepReason::Daily.to_string(), "daily snapshot");
}

#[test]
fn keep_within_counts_from_the_newest_snapshot_not_from_now() {
    // The newest is 06:30 on Dec 2; two days before it is 06:30 on Nov 30.
    check(
        HISTORY,
        KeepPolicy::new().with_within("2d".parse().unwrap()),
        &[
            "2026-12-02T06:30:00",
            "2026-12-02T06:00:00",
            "2026-12-01T21:00:00",
            "2026-12-01T09:00:00",
            "2026-11-30T20:00:00",
            "2026-11-30T08:00:00",
        ],
    );
    // A source that stopped a year ago keeps its last days.
    let old = &[
        "2025-06-10T10:00:00",
        "2025-06-09T10:00:00",
        "2025-05-01T10:00:00",
    ];
    check(
        old,
        KeepPolicy::new().with_within("3d".parse().unwrap()),
        &["2025-06-10T10:00:00", "2025-06-09T10:00:00"],
    );
}

#[test]
fn keep_within_is_strictly_newer() {
    check(
        &[
            "2026-12-02T10:00:00",
            "2026-12-02T06:00:00",
            "2026-12-02T05:59:59",
        ],
        KeepPolicy::new().with_within("4h".parse().unwrap()),
        &["2026-12-02T10:00:00"],
    );
}

#[test]
fn keep_within_months_overflow_like_go() {
    // March 31 minus one month is "February 31", which rolls to March 3 (2026 is a
    // common year).
    check(
        &[
            "2026-03-31T00:00:00",
            "2026-03-03T00:00:01",
            "2026-03-03T00:00:00",
            "2026-03-02T00:00:00",
        ],
        KeepPolicy::new().with_within("1m".parse().unwrap()),
        &["2026-03-31T00:00:00", "2026-03-03T00:00:01"],
    );
}

#[test]
fn snapshots_from_the_future_do_not_move_within() {
    check(
        &[
            "2027-01-01T00:00:00",
            "2026-12-02T11:00:00",
            "2026-12-01T11:00:00",
            "2026-11-25T11:00:00",
        ],
        KeepPolicy::new().with_within("1d1h".parse().unwrap()),
        &[
            "2027-01-01T00:00:00",
            "2026-12-02T11:00:00",
            "2026-12-01T11:00:00",
        ],
    );
}

#[test]
fn each_source_is_judged_alone() {
    let mut all = snaps("vm1", &["2026-12-02T10:00:00", "2026-12-01T10:00:00"]);
    all.extend(snaps(
        "vm2",
        &["2026-11-01T10:00:00", "2026-10-01T10:00:00"],
    ));
    let plan = plan(&all, &KeepPolicy::new().with_last(Keep::Count(1)), t(NOW));
    let kept: Vec<(String, String)> = plan
        .kept()
        .map(|s| (s.source.clone(), s.time.format("%m-%d").to_string()))
        .collect();
    assert_eq!(
        kept,
        [
            ("vm1".to_string(), "12-02".to_string()),
            ("vm2".to_string(), "11-01".to_string())
        ]
    );
    assert_eq!(plan.forgotten().count(), 2);
}

#[test]
fn an_empty_policy_keeps_everything() {
    let policy = KeepPolicy::new().with_daily(Keep::Count(0));
    assert!(policy.is_empty());
    let plan = plan(&snaps("vm1", HISTORY), &policy, t(NOW));
    assert_eq!(plan.kept().count(), HISTORY.len());
    assert!(plan
        .decisions
        .iter()
        .all(|d| d.reasons == [KeepReason::EmptyPolicy]));
}

#[test]
fn no_snapshots_no_decisions() {
    assert!(
        plan(&[], &KeepPolicy::new().with_last(Keep::Count(1)), t(NOW))
            .decisions
            .is_empty()
    );
}

#[test]
fn durations_parse_like_restic() {
    let d: CalendarDuration = "1y2m3d4h".parse().unwrap();
    assert_eq!((d.years, d.months, d.days, d.hours), (1, 2, 3, 4));
    assert_eq!(d.to_string(), "1y2m3d4h");
    assert_eq!("36h".parse::<CalendarDuration>().unwrap().hours, 36);
    for bad in ["", "5", "d", "1d2y", "1w", "1d1d", "-1d", "1.5d"] {
        assert!(bad.parse::<CalendarDuration>().is_err(), "{bad}");
    }
}

#[test]
fn calendar_arithmetic() {
    let d: CalendarDuration = "1y".parse().unwrap();
    // February 29 minus a year is "February 29, 2023": March 1.
    assert_eq!(
        d.before(t("2024-02-29T12:00:00")),
        Some(t("2023-03-01T12:00:00"))
    );
    let d: CalendarDuration = "13m".parse().unwrap();
    assert_eq!(
        d.before(t("2026-01-15T00:00:00")),
        Some(t("2024-12-15T00:00:00"))
    );
    let d: CalendarDuration = "1d25h".parse().unwrap();
    assert_eq!(
        d.before(t("2026-12-03T00:00:00")),
        Some(t("2026-11-30T23:00:00"))
    );
}

#[test]
fn protected_snapshots_are_kept_and_set_aside_before_the_rules_count() {
    let mut list = snaps(
        "a",
        &[
            "2026-12-02T10:00:00",
            "2026-12-02T09:00:00",
            "2026-12-01T10:00:00",
            "2026-11-30T10:00:00",
        ],
    );
    // The newest and the oldest are protected; keep-last 1 keeps the newest of the rest.
    list[0].protected = true;
    list[3].protected = true;
    let plan = plan(&list, &KeepPolicy::new().with_last(Keep::Count(1)), t(NOW));
    let reasons = |time: &str| {
        plan.decisions
            .iter()
            .find(|d| d.snapshot.time == t(time))
            .unwrap()
            .reasons
            .clone()
    };
    assert_eq!(reasons("2026-12-02T10:00:00"), [KeepReason::Protected]);
    assert_eq!(reasons("2026-11-30T10:00:00"), [KeepReason::Protected]);
    assert_eq!(reasons("2026-12-02T09:00:00"), [KeepReason::Last]);
    assert!(reasons("2026-12-01T10:00:00").is_empty());
    assert_eq!(KeepReason::Protected.to_string(), "protected");
}
