//! The control record: the global kill switch, each action type's rollout mode, and the
//! risk policy set at run time. Every gate (plan, execute, the worker) reads it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::core::domain::{ActionType, Millis};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RolloutMode {
    Disabled,
    PlanOnly,
    Execute,
}

impl std::str::FromStr for RolloutMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "disabled" => Ok(RolloutMode::Disabled),
            "plan_only" => Ok(RolloutMode::PlanOnly),
            "execute" => Ok(RolloutMode::Execute),
            _ => Err("expected disabled, plan_only or execute".into()),
        }
    }
}

/// The global control record: the kill switch and per-action rollout modes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Control {
    pub trade_execute_enabled: bool,
    pub rollout: BTreeMap<String, RolloutMode>,
    pub updated_at: Millis,
    pub updated_by: String,
    pub reason: Option<String>,
    /// The risk policy in force, when set here (`airlock policy set`); otherwise the
    /// process's own (the state dir's `policy.json`, or the defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<super::Policy>,
    /// Bumped by every write; each write is conditional on the version it read, so two
    /// operators' changes never undo each other. 0: never written.
    #[serde(default)]
    pub version: u64,
    /// The kill switch's current engagement, or its last one once released: an engage of
    /// a released switch starts a new one, an engage of an engaged switch keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engagement: Option<Engagement>,
}

/// One engagement of the kill switch: the cancels it queues are
/// named after its id, so engaging again while it lasts queues nothing twice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Engagement {
    pub id: String,
    pub at: Millis,
    pub by: String,
}

impl Default for Control {
    fn default() -> Self {
        Control {
            trade_execute_enabled: true,
            rollout: ActionType::ALL
                .iter()
                .map(|a| (a.as_str().to_string(), RolloutMode::Execute))
                .collect(),
            updated_at: 0,
            updated_by: "default".into(),
            reason: None,
            policy: None,
            version: 0,
            engagement: None,
        }
    }
}

impl Control {
    /// Unlisted action types are disabled: a new action never runs by accident.
    pub fn mode(&self, a: ActionType) -> RolloutMode {
        self.rollout
            .get(a.as_str())
            .copied()
            .unwrap_or(RolloutMode::Disabled)
    }

    /// Whether an execute of `a` may go through now.
    pub fn allows_execute(&self, a: ActionType) -> bool {
        (self.trade_execute_enabled || !a.is_order_submission())
            && self.mode(a) == RolloutMode::Execute
    }

    /// Engages the kill switch with `reason`. A released switch (or one engaged with no
    /// engagement recorded) starts the engagement `id`, at `at`, by `by`; an engaged one
    /// keeps the engagement it has, so engaging twice is one engagement.
    pub fn engage(&mut self, id: &str, at: Millis, by: &str, reason: Option<String>) {
        if self.trade_execute_enabled || self.engagement.is_none() {
            self.engagement = Some(Engagement {
                id: id.to_string(),
                at,
                by: by.to_string(),
            });
        }
        self.trade_execute_enabled = false;
        self.reason = reason;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engaging_an_engaged_switch_keeps_its_engagement_and_a_released_one_starts_anew() {
        let mut c = Control::default();
        c.engage("ks_1", 10, "cli:ann", Some("first".into()));
        assert!(!c.trade_execute_enabled);
        c.engage("ks_2", 20, "cli:bob", Some("again".into()));
        let e = c.engagement.clone().unwrap();
        assert_eq!(
            (e.id.as_str(), e.at, e.by.as_str()),
            ("ks_1", 10, "cli:ann")
        );
        assert_eq!(c.reason.as_deref(), Some("again"));
        // Released, the engagement stays as the last one; the next engage starts a new one.
        c.trade_execute_enabled = true;
        c.engage("ks_3", 30, "cli:bob", None);
        assert_eq!(c.engagement.unwrap().id, "ks_3");
        // Engaged before engagements were recorded: the next engage records one.
        let mut old = Control {
            trade_execute_enabled: false,
            ..Control::default()
        };
        old.engage("ks_4", 40, "cli:cy", None);
        assert_eq!(old.engagement.unwrap().id, "ks_4");
    }
}
