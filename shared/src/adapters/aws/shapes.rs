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
    /// `ALL` (queries read whole items from the index) or `KEYS_ONLY` (queries read keys,
    /// then the items from the table).
    pub projection: &'static str,
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
            projection: "ALL",
        },
        Index {
            name: "by_account",
            partition: "account_id",
            sort: "created_key",
            sort_is_number: false,
            projection: "ALL",
        },
        // Sparse: `open_account` (the account id) is present only while the order is at
        // the broker, so reconciliation reads open orders, never an account's history.
        Index {
            name: "open_by_account",
            partition: "open_account",
            sort: "created_key",
            sort_is_number: false,
            projection: "ALL",
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
        projection: "ALL",
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
            projection: "ALL",
        },
        Index {
            name: "awaiting_requester",
            partition: "awaiting_requester",
            sort: "expires_at",
            sort_is_number: true,
            projection: "ALL",
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

/// The sweeper's sparse index of unsent actions, [`UNSENT_INDEX`]: `unsent_shard`
/// ([`unsent_shard`]) is present only until the action's message was sent, and spreads
/// the index over [`UNSENT_SHARDS`] partitions; keys only (the sweeper reads each action
/// from the table, consistently, before acting on it).
///
/// [`LEGACY_UNSENT_INDEX`] is the index of the release before: one partition (`unsent =
/// "1"`), projected ALL. Nothing writes `unsent` any more; the index stays for one release
/// so the sweeper still finds the actions accepted before the upgrade (every write that
/// takes an action out of the sweeper's view removes both attributes). An action leaves it
/// within a day (sent, or retired once its idempotency key expired); the release after
/// drops the index (docs/DECISIONS.md, "The single-partition unsent index is read until it
/// empties").
pub const ACTIONS: Table = Table {
    logical_id: "ActionsTable",
    env: "AIRLOCK_ACTIONS_TABLE",
    default_name: "airlock-actions",
    partition: "action_id",
    sort: None,
    indexes: &[
        Index {
            name: UNSENT_INDEX,
            partition: UNSENT_SHARD_ATTRIBUTE,
            sort: "created_at",
            sort_is_number: true,
            projection: "KEYS_ONLY",
        },
        Index {
            name: LEGACY_UNSENT_INDEX,
            partition: LEGACY_UNSENT_ATTRIBUTE,
            sort: "created_at",
            sort_is_number: true,
            projection: "ALL",
        },
    ],
    ttl: None,
};

/// The actions table's index of unsent actions, sharded (see [`ACTIONS`]).
pub const UNSENT_INDEX: &str = "unsent_by_shard";
/// Its partition key: `u#<n>`, `n` < [`UNSENT_SHARDS`].
pub const UNSENT_SHARD_ATTRIBUTE: &str = "unsent_shard";
/// The partitions of [`UNSENT_INDEX`]. An action costs its shard two index writes (in, and
/// out once sent), each of a key-only entry under 1 KB (1 write unit); a partition takes
/// 1,000 units a second, so a shard about 500 actions a second and the index about 8,000
/// (docs/RELIABILITY.md, capacity). The sweeper queries every shard. It may grow (new actions spread wider, the
/// sweeper reads the new shards too); shrinking it would hide the actions on the shards
/// dropped until they are rewritten.
pub const UNSENT_SHARDS: u32 = 16;
/// The index of the release before (see [`ACTIONS`]): read by the sweeper while it exists.
pub const LEGACY_UNSENT_INDEX: &str = "unsent";
pub const LEGACY_UNSENT_ATTRIBUTE: &str = "unsent";

/// The shard of an action in [`UNSENT_INDEX`]: `u#<n>`, `n` the first four bytes of the
/// SHA-256 of its id modulo [`UNSENT_SHARDS`]. Ids share their time prefix within a
/// millisecond; the hash spreads them anyway.
pub fn unsent_shard(action_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(action_id.as_bytes());
    let n = u32::from_be_bytes([d[0], d[1], d[2], d[3]]) % UNSENT_SHARDS;
    format!("u#{n}")
}

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
    max_receive_count: crate::core::records::MAX_RECEIVES,
};

pub const JOBS_QUEUE: QueueShape = QueueShape {
    logical_id: "JobsQueue",
    env: "AIRLOCK_JOBS_QUEUE_URL",
    default_name: "airlock-jobs",
    fifo: false,
    dead_letter_name: "airlock-jobs-dlq",
    dead_letter_env: "AIRLOCK_JOBS_DEAD_LETTER_QUEUE_URL",
    max_receive_count: crate::core::records::MAX_RECEIVES,
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
