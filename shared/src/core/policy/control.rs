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
}
