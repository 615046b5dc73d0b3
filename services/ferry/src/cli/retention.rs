//! The `--keep-*` flags of a retention policy, one set for every command that takes one:
//! `ferry backup prune` (applied here), `ferry job prune`, `ferry job backup` and
//! `ferry schedule create` (sent to a service, through ferry-api's one wire mapping).

use clap::Args;
use ferry_api::proto;
use ferry_backup::{CalendarDuration, Keep, KeepPolicy};

/// A retention policy: which backups of each source a prune keeps.
#[derive(Debug, Clone, Default, Args)]
pub struct RetentionArgs {
    /// Keep the N most recent backups of each source (all: every one).
    #[arg(long, value_name = "N", value_parser = keep)]
    pub keep_last: Option<Keep>,
    /// Keep the latest backup of each of the last N hours that have one.
    #[arg(long, value_name = "N", value_parser = keep)]
    pub keep_hourly: Option<Keep>,
    /// ... of each of the last N days.
    #[arg(long, value_name = "N", value_parser = keep)]
    pub keep_daily: Option<Keep>,
    /// ... of each of the last N weeks.
    #[arg(long, value_name = "N", value_parser = keep)]
    pub keep_weekly: Option<Keep>,
    /// ... of each of the last N months.
    #[arg(long, value_name = "N", value_parser = keep)]
    pub keep_monthly: Option<Keep>,
    /// ... of each of the last N years.
    #[arg(long, value_name = "N", value_parser = keep)]
    pub keep_yearly: Option<Keep>,
    /// Keep every backup within this duration of the newest, like 1y2m3d4h.
    #[arg(long, value_name = "DURATION", value_parser = within)]
    pub keep_within: Option<CalendarDuration>,
}

/// A keep count: a number, or `all`.
fn keep(text: &str) -> Result<Keep, String> {
    if text == "all" || text == "unlimited" {
        return Ok(Keep::All);
    }
    text.parse::<u32>()
        .ok()
        .filter(|&n| i32::try_from(n).is_ok())
        .map(Keep::Count)
        .ok_or_else(|| format!("'{text}' is not a count (a number, or 'all')"))
}

fn within(text: &str) -> Result<CalendarDuration, String> {
    text.parse()
        .map_err(|e: ferry_core::Error| e.message().to_string())
}

impl RetentionArgs {
    /// The policy the flags give (empty when none is given).
    pub fn policy(&self) -> KeepPolicy {
        let mut policy = KeepPolicy::new();
        policy.last = self.keep_last;
        policy.hourly = self.keep_hourly;
        policy.daily = self.keep_daily;
        policy.weekly = self.keep_weekly;
        policy.monthly = self.keep_monthly;
        policy.yearly = self.keep_yearly;
        policy.within = self.keep_within;
        policy
    }

    /// The policy on the wire, when any rule is given.
    pub fn to_proto(&self) -> Option<proto::Retention> {
        let policy = self.policy();
        (!policy.is_empty()).then(|| ferry_api::options::retention_to_proto(&policy))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        retention: RetentionArgs,
    }

    #[test]
    fn keeps() {
        assert_eq!(keep("3"), Ok(Keep::Count(3)));
        assert_eq!(keep("all"), Ok(Keep::All));
        assert!(keep("-1").is_err());
        assert!(keep("4294967295").is_err());
    }

    #[test]
    fn flags_become_the_policy_and_the_wire() {
        let cli = Cli::parse_from([
            "x",
            "--keep-last",
            "all",
            "--keep-daily",
            "7",
            "--keep-within",
            "1y2m",
        ]);
        let policy = cli.retention.policy();
        assert_eq!(policy.last, Some(Keep::All));
        assert_eq!(policy.daily, Some(Keep::Count(7)));
        assert_eq!(policy.within.unwrap().months, 2);
        let wire = cli.retention.to_proto().unwrap();
        assert_eq!(
            (wire.keep_last, wire.keep_daily, wire.keep_hourly),
            (-1, 7, 0)
        );
        assert_eq!(wire.keep_within, "1y2m");
        assert!(Cli::parse_from(["x"]).retention.to_proto().is_none());
        assert!(Cli::try_parse_from(["x", "--keep-within", "3x"]).is_err());
    }
}
