//! EBS volume modifications as surge sees them: DescribeVolumesModifications'
//! `VolumeModification` as a [`Modification`] (pure, so it is tested with
//! constructed SDK values: moto reports every modification `completed` at
//! once), and the per-volume history that keeps surge within the configured
//! modification rule ([`History`]).

use aws_sdk_ec2::types::VolumeModification;
use std::time::Duration;
use surge_cloud::{Modification, ModificationState, ModifyRules};

/// A `VolumeModification` as a [`Modification`]; `None` if it has no state
/// (EBS: "the modification state is null for unmodified volumes") or a state
/// surge does not know.
pub fn parse(m: &VolumeModification) -> Option<Modification> {
    let state = match m.modification_state()?.as_str() {
        "modifying" => ModificationState::Modifying,
        "optimizing" => ModificationState::Optimizing,
        "completed" => ModificationState::Completed,
        "failed" => ModificationState::Failed,
        _ => return None,
    };
    let ms = |t: Option<&aws_sdk_ec2::primitives::DateTime>| t.and_then(|t| t.to_millis().ok()).map(|x| x.max(0) as u64);
    // The spec it moves to, when EBS names every part of it.
    let target = match (m.target_volume_type(), m.target_size()) {
        (Some(t), Some(size)) => crate::ebs::spec_of(t.as_str(), size, m.target_iops(), m.target_throughput()).ok().map(|s| s.to_string()),
        _ => None,
    };
    Some(Modification {
        state,
        progress_percent: m.progress().map(|p| p.clamp(0, 100) as u32),
        started_unix_ms: ms(m.start_time()),
        ended_unix_ms: ms(m.end_time()),
        target,
        target_iops: m.target_iops().and_then(|i| u64::try_from(i).ok()),
        target_throughput_mibps: m.target_throughput().and_then(|i| u64::try_from(i).ok()),
        message: m.status_message().filter(|s| !s.is_empty()).map(str::to_string),
    })
}

/// The latest of several modifications of one volume (by start time).
pub fn latest(ms: &[VolumeModification], volume: &str) -> Option<Modification> {
    ms.iter().filter(|m| m.volume_id().is_none_or(|v| v == volume)).filter_map(parse).max_by_key(|m| m.started_unix_ms.unwrap_or(0))
}

/// What surge knows of one volume's modifications (times since the UNIX
/// epoch): the ones this process made, AWS's latest, and AWS's last refusal.
#[derive(Debug, Default, Clone)]
pub struct History {
    made: Vec<Duration>,
    refused_at: Option<Duration>,
}

impl History {
    /// Why `rules` refuse a modification at `now`, given the cloud's latest
    /// modification (`Ok(None)`: never modified; `Err(())`: the cloud could
    /// not tell), or `None` if allowed. After a refusal by AWS, nothing is
    /// asked again for `retry` (AWS knows of modifications surge does not,
    /// e.g. made by hand).
    pub fn refuses(&self, rules: &ModifyRules, now: Duration, latest: Result<Option<&Modification>, ()>, retry: Duration) -> Option<String> {
        if let Some(t) = self.refused_at.filter(|&t| now < t + retry) {
            return Some(format!("AWS refused the last modification {:.0} s ago; surge asks again {:.0} s after a refusal", now.saturating_sub(t).as_secs_f64(), retry.as_secs_f64()));
        }
        let mut past = self.made.clone();
        let in_flight = match latest {
            Ok(Some(m)) => {
                // AWS's start time of one surge made is a moment after surge's own.
                if let Some(t) = m.started_unix_ms.map(Duration::from_millis) {
                    if !past.iter().any(|&p| p.abs_diff(t) < Duration::from_secs(60)) {
                        past.push(t);
                    }
                }
                Some(m.state.in_flight())
            }
            Ok(None) => Some(false),
            Err(()) => None,
        };
        rules.refuses_with(&past, now, in_flight)
    }

    pub fn made(&mut self, rules: &ModifyRules, now: Duration) {
        self.made.push(now);
        let keep = rules.memory();
        if self.made.len() > keep {
            self.made.drain(..self.made.len() - keep);
        }
        self.refused_at = None;
    }

    pub fn refused(&mut self, now: Duration) {
        self.refused_at = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ec2::types::{VolumeModificationState, VolumeType};
    use aws_sdk_ec2::primitives::DateTime;

    fn sdk(state: VolumeModificationState, progress: i64, start_s: i64) -> VolumeModification {
        VolumeModification::builder()
            .volume_id("vol-1")
            .modification_state(state)
            .progress(progress)
            .start_time(DateTime::from_secs(start_s))
            .target_volume_type(VolumeType::Gp3)
            .target_size(100)
            .target_iops(16_000)
            .target_throughput(1_000)
            .original_volume_type(VolumeType::Gp3)
            .original_size(100)
            .build()
    }

    #[test]
    fn sdk_modifications_become_surge_modifications() {
        let m = parse(&sdk(VolumeModificationState::Optimizing, 42, 1_000)).unwrap();
        assert_eq!(m.state, ModificationState::Optimizing);
        assert!(m.state.in_flight());
        assert_eq!((m.progress_percent, m.started_unix_ms, m.ended_unix_ms), (Some(42), Some(1_000_000), None));
        assert_eq!(m.target.as_deref(), Some("gp3:100GiB,iops=16000,throughput=1000MiB/s"));
        assert_eq!((m.target_iops, m.target_throughput_mibps), (Some(16_000), Some(1_000)));
        let failed = VolumeModification::builder()
            .modification_state(VolumeModificationState::Failed)
            .status_message("Modification failed: the target size is too small")
            .end_time(DateTime::from_secs(5))
            .build();
        let f = parse(&failed).unwrap();
        assert_eq!((f.state, f.target.as_deref(), f.ended_unix_ms), (ModificationState::Failed, None, Some(5_000)));
        assert!(f.message.unwrap().contains("too small"));
        assert!(!f.state.in_flight());
        // No state: an unmodified volume; an unknown state is not guessed.
        assert_eq!(parse(&VolumeModification::builder().volume_id("vol-1").build()), None);
        assert_eq!(parse(&VolumeModification::builder().modification_state(VolumeModificationState::from("paused")).build()), None);
        // The latest by start time, of this volume only.
        let all = [sdk(VolumeModificationState::Completed, 100, 10), sdk(VolumeModificationState::Modifying, 0, 20)];
        assert_eq!(latest(&all, "vol-1").unwrap().state, ModificationState::Modifying);
        assert_eq!(latest(&all, "vol-2"), None);
    }

    #[test]
    fn the_history_follows_the_rule_and_the_clouds_state() {
        let (s, m) = (|x: u64| Duration::from_secs(x), |x: u64| Duration::from_secs(60 * x));
        let retry = m(10);
        let rolling = ModifyRules::ebs_rolling();
        let mut h = History::default();
        assert!(h.refuses(&rolling, s(0), Ok(None), retry).is_none());
        h.made(&rolling, s(0));
        let at = |state, start: Duration| Modification {
            state,
            progress_percent: None,
            started_unix_ms: Some(start.as_millis() as u64),
            ended_unix_ms: None,
            target: None,
            target_iops: None,
            target_throughput_mibps: None,
            message: None,
        };
        // Rolling: AWS says optimizing after an hour: wait; completed after a minute: go.
        assert!(h.refuses(&rolling, m(60), Ok(Some(&at(ModificationState::Optimizing, s(1)))), retry).unwrap().contains("not completed"));
        assert!(h.refuses(&rolling, m(1), Ok(Some(&at(ModificationState::Completed, s(1)))), retry).is_none());
        // The cloud cannot tell: the rule's guess (5 minutes).
        assert!(h.refuses(&rolling, m(1), Err(()), retry).unwrap().contains("still optimizing"));
        for t in 1..4 {
            h.made(&rolling, m(10 * t));
        }
        let done = at(ModificationState::Completed, m(30));
        assert!(h.refuses(&rolling, m(40), Ok(Some(&done)), retry).unwrap().contains("at most 4"));
        // Classic: 6 hours after the last, AWS's start time counting (a restart forgot its own).
        let classic = ModifyRules::ebs();
        let fresh = History::default();
        assert!(fresh.refuses(&classic, m(60), Ok(Some(&at(ModificationState::Completed, m(30)))), retry).unwrap().contains("once per"));
        assert!(fresh.refuses(&classic, m(30) + s(6 * 3_600), Ok(Some(&at(ModificationState::Completed, m(30)))), retry).is_none());
        // A refusal by AWS: nothing asked again for `retry`.
        let mut h = History::default();
        h.refused(m(0));
        assert!(h.refuses(&ModifyRules::default(), m(9), Ok(None), retry).unwrap().contains("refused"));
        assert!(h.refuses(&ModifyRules::default(), m(10), Ok(None), retry).is_none());
    }
}
