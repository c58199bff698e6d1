//! Jobs: work on an account that is not an order (a positions sync).

use serde::{Deserialize, Serialize};

use super::{JobKind, JobStatus, Millis};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub job_id: String,
    pub kind: JobKind,
    pub status: JobStatus,
    pub account_id: Option<String>,
    pub action_id: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub error: Option<String>,
    /// What the job did (a sync: the positions that changed).
    #[serde(default)]
    pub result: Option<serde_json::Value>,
}
