//! The AWS resource shapes the code relies on, in one place: tables (keys, indexes, TTL
//! attributes), queues, and the signing key alias, with the environment variable that
//! names each one (the SAM template's `Environment` keys) and its default name (used by
//! `airlock serve --backend aws` and `airlock bootstrap` against an emulator).
//! The SAM template (`infra/template.yaml`) declares the resources; each entry here names
//! its template resource by logical id. `airlock bootstrap` creates the resources from the
//! template (see [`template`](super::template)), and a test there checks that the template
//! still has the keys, indexes, TTL attributes, queues and key this code relies on.

use crate::config::AwsConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Index {
    pub name: &'static str,
    pub partition: &'static str,
    /// Sort keys of indexes here are strings or numbers, as `sort_is_number` says.
    pub sort: &'static str,
    pub sort_is_number: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Table {
    /// The table's logical id in `infra/template.yaml`.
    pub logical_id: &'static str,
    /// Environment variable holding the table name.
    pub env: &'static str,
    pub default_name: &'static str,
    pub partition: &'static str,
    pub sort: Option<&'static str>,
    pub indexes: &'static [Index],
    /// Epoch-seconds TTL attribute; DynamoDB deletes lazily, so code also compares it.
    pub ttl: Option<&'static str>,
}

pub const ACCOUNTS: Table = Table {
    logical_id: "AccountsTable",
    env: "AIRLOCK_ACCOUNTS_TABLE",
    default_name: "airlock-accounts",
    partition: "account_id",
    sort: None,
    indexes: &[],
    ttl: None,
};

pub const POSITIONS: Table = Table {
    logical_id: "PositionsTable",
    env: "AIRLOCK_POSITIONS_TABLE",
    default_name: "airlock-positions",
    partition: "account_id",
    sort: Some("symbol"),
    indexes: &[],
    ttl: None,
};

/// Per account and contract: `position` (kept with every position write), `open_buy`,
/// `open_sell`, and the derived `worst_long` / `worst_short` that conditions compare.
pub const EXPOSURES: Table = Table {
    logical_id: "ExposuresTable",
    env: "AIRLOCK_EXPOSURES_TABLE",
    default_name: "airlock-exposures",
    partition: "account_id",
    sort: Some("symbol"),
    indexes: &[],
    ttl: None,
};

/// `created_key` = zero-padded created_at millis, `#`, id: newest-first keyset order.
pub const ORDERS: Table = Table {
    logical_id: "OrdersTable",
    env: "AIRLOCK_ORDERS_TABLE",
    default_name: "airlock-orders",
    partition: "order_id",
    sort: None,
    indexes: &[
        Index {
            name: "by_desk",
            partition: "desk",
            sort: "created_key",
            sort_is_number: false,
        },
        Index {
            name: "by_account",
            partition: "account_id",
            sort: "created_key",
            sort_is_number: false,
        },
        // Sparse: `open_account` (the account id) is present only while the order is at
        // the broker, so reconciliation reads open orders, never an account's history.
        Index {
            name: "open_by_account",
            partition: "open_account",
            sort: "created_key",
            sort_is_number: false,
        },
    ],
    ttl: None,
};

pub const JOBS: Table = Table {
    logical_id: "JobsTable",
    env: "AIRLOCK_JOBS_TABLE",
    default_name: "airlock-jobs",
    partition: "job_id",
    sort: None,
    indexes: &[Index {
        name: "by_desk",
        partition: "desk",
        sort: "created_key",
        sort_is_number: false,
    }],
    ttl: None,
};

/// `awaiting_requester` (who asked) is present only while an `operator`-mode plan waits for
/// its approval, and `awaiting_desk` (the plan's desk) only while a four-eyes plan does: two
/// sparse indexes for the pending-approvals listing.
pub const PLANS: Table = Table {
    logical_id: "PlansTable",
    env: "AIRLOCK_PLANS_TABLE",
    default_name: "airlock-plans",
    partition: "plan_id",
    sort: None,
    indexes: &[
        Index {
            name: "awaiting",
            partition: "awaiting_desk",
            sort: "expires_at",
            sort_is_number: true,
        },
        Index {
            name: "awaiting_requester",
            partition: "awaiting_requester",
            sort: "expires_at",
            sort_is_number: true,
        },
    ],
    ttl: Some("ttl"),
};

/// The approval channel's documents by kind (`operator`, `enrolment`, `challenge`,
/// `session`) and id, each with a version and an expiry (`expires_at` millis, compared by
/// every read and condition; `ttl` seconds for DynamoDB's lazy deletion).
pub const APPROVALS: Table = Table {
    logical_id: "ApprovalsTable",
    env: "AIRLOCK_APPROVALS_TABLE",
    default_name: "airlock-approvals",
    partition: "kind",
    sort: Some("id"),
    indexes: &[],
    ttl: Some("ttl"),
};

pub const IDEMPOTENCY: Table = Table {
    logical_id: "IdempotencyTable",
    env: "AIRLOCK_IDEMPOTENCY_TABLE",
    default_name: "airlock-idempotency",
    partition: "pk",
    sort: None,
    indexes: &[],
    ttl: Some("ttl"),
};

/// `unsent` is present only until the action's message was sent: a sparse index the
/// sweeper reads.
pub const ACTIONS: Table = Table {
    logical_id: "ActionsTable",
    env: "AIRLOCK_ACTIONS_TABLE",
    default_name: "airlock-actions",
    partition: "action_id",
    sort: None,
    indexes: &[Index {
        name: "unsent",
        partition: "unsent",
        sort: "created_at",
        sort_is_number: true,
    }],
    ttl: None,
};

/// Audit records by plan, in time order (`seq` = zero-padded millis, `#`, audit id).
pub const AUDIT: Table = Table {
    logical_id: "AuditTable",
    env: "AIRLOCK_AUDIT_TABLE",
    default_name: "airlock-audit",
    partition: "plan_id",
    sort: Some("seq"),
    indexes: &[],
    ttl: None,
};

pub const CONTROL: Table = Table {
    logical_id: "ControlTable",
    env: "AIRLOCK_CONTROL_TABLE",
    default_name: "airlock-control",
    partition: "id",
    sort: None,
    indexes: &[],
    ttl: None,
};

pub const RATE_LIMITS: Table = Table {
    logical_id: "RateLimitsTable",
    env: "AIRLOCK_RATE_LIMITS_TABLE",
    default_name: "airlock-rate-limits",
    partition: "operator_id",
    sort: None,
    indexes: &[],
    ttl: Some("ttl"),
};

/// The paper broker's book (versioned JSON documents): a stand-in for a broker.
pub const PAPER_BROKER: Table = Table {
    logical_id: "PaperBrokerTable",
    env: "AIRLOCK_PAPER_BROKER_TABLE",
    default_name: "airlock-paper-broker",
    partition: "key",
    sort: None,
    indexes: &[],
    ttl: None,
};

pub const TABLES: &[Table] = &[
    ACCOUNTS,
    POSITIONS,
    EXPOSURES,
    ORDERS,
    JOBS,
    PLANS,
    IDEMPOTENCY,
    ACTIONS,
    AUDIT,
    CONTROL,
    RATE_LIMITS,
    PAPER_BROKER,
    APPROVALS,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueShape {
    /// The queue's logical id in `infra/template.yaml` (its dead-letter queue is the
    /// target of the template's `RedrivePolicy`).
    pub logical_id: &'static str,
    /// Environment variable holding the queue URL.
    pub env: &'static str,
    pub default_name: &'static str,
    pub fifo: bool,
    pub dead_letter_name: &'static str,
    /// Environment variable holding the dead-letter queue's URL (else found by name).
    pub dead_letter_env: &'static str,
    /// Receives before a message moves to the dead-letter queue.
    pub max_receive_count: u32,
}

pub const ORDERS_QUEUE: QueueShape = QueueShape {
    logical_id: "OrdersQueue",
    env: "AIRLOCK_ORDERS_QUEUE_URL",
    default_name: "airlock-orders.fifo",
    fifo: true,
    dead_letter_name: "airlock-orders-dlq.fifo",
    dead_letter_env: "AIRLOCK_ORDERS_DEAD_LETTER_QUEUE_URL",
    max_receive_count: crate::records::MAX_RECEIVES,
};

pub const JOBS_QUEUE: QueueShape = QueueShape {
    logical_id: "JobsQueue",
    env: "AIRLOCK_JOBS_QUEUE_URL",
    default_name: "airlock-jobs",
    fifo: false,
    dead_letter_name: "airlock-jobs-dlq",
    dead_letter_env: "AIRLOCK_JOBS_DEAD_LETTER_QUEUE_URL",
    max_receive_count: crate::records::MAX_RECEIVES,
};

pub const QUEUES: &[QueueShape] = &[ORDERS_QUEUE, JOBS_QUEUE];

/// Environment variable naming the KMS signing key (id, ARN or alias).
pub const SIGNING_KEY_ENV: &str = "AIRLOCK_SIGNING_KEY_ID";

/// The signing key's alias, after `alias/` and the resource prefix.
pub const SIGNING_ALIAS_NAME: &str = "airlock-confirmation";

impl Table {
    /// The table's name: the one its variable gives, else the prefixed default.
    pub fn name(&self, names: &AwsConfig) -> String {
        names
            .given(self.env)
            .map(String::from)
            .unwrap_or_else(|| format!("{}{}", names.resource_prefix, self.default_name))
    }
}

impl QueueShape {
    /// The queue's name (prefixed default; the environment gives URLs, not names).
    pub fn name(&self, names: &AwsConfig) -> String {
        format!("{}{}", names.resource_prefix, self.default_name)
    }

    pub fn dead_letter(&self, names: &AwsConfig) -> String {
        format!("{}{}", names.resource_prefix, self.dead_letter_name)
    }
}

/// The signing key: `AIRLOCK_SIGNING_KEY_ID`, else the prefixed default alias.
pub fn signing_key(names: &AwsConfig) -> String {
    names
        .given(SIGNING_KEY_ENV)
        .map(String::from)
        .unwrap_or_else(|| default_signing_alias(names))
}

/// The alias `airlock bootstrap` creates.
pub fn default_signing_alias(names: &AwsConfig) -> String {
    format!("alias/{}{SIGNING_ALIAS_NAME}", names.resource_prefix)
}
