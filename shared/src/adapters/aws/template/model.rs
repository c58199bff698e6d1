//! What the template declares, as the code reads it.

use std::collections::BTreeMap;

use serde_yaml::Value;

/// A DynamoDB attribute type in a key schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttrType {
    S,
    N,
    B,
}

/// Partition and optional sort key attribute names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySchema {
    pub partition: String,
    pub sort: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexDef {
    pub name: String,
    pub key: KeySchema,
    /// `ALL`, `KEYS_ONLY` or `INCLUDE`.
    pub projection: String,
}

/// An `AWS::DynamoDB::Table`.
#[derive(Debug, Clone)]
pub struct TableDef {
    pub logical_id: String,
    /// `TableName` as written: a literal or a `!Sub` pattern.
    pub name_pattern: Option<String>,
    pub attributes: Vec<(String, AttrType)>,
    pub key: KeySchema,
    pub indexes: Vec<IndexDef>,
    /// The TTL attribute, when TTL is enabled.
    pub ttl: Option<String>,
    pub billing_mode: Option<String>,
    pub point_in_time_recovery: bool,
}

impl TableDef {
    pub fn attr_type(&self, name: &str) -> Option<AttrType> {
        self.attributes
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| *t)
    }

    pub fn index(&self, name: &str) -> Option<&IndexDef> {
        self.indexes.iter().find(|i| i.name == name)
    }
}

/// A queue's `RedrivePolicy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redrive {
    /// Logical id of the dead-letter queue.
    pub dead_letter: String,
    pub max_receive_count: u32,
}

/// An `AWS::SQS::Queue`.
#[derive(Debug, Clone)]
pub struct QueueDef {
    pub logical_id: String,
    /// `QueueName` as written: a literal or a `!Sub` pattern.
    pub name_pattern: Option<String>,
    pub fifo: bool,
    pub content_based_deduplication: bool,
    pub visibility_timeout_s: Option<u32>,
    pub retention_s: Option<u32>,
    pub redrive: Option<Redrive>,
}

/// An `AWS::KMS::Key`.
#[derive(Debug, Clone)]
pub struct KeyDef {
    pub logical_id: String,
    pub key_spec: String,
    pub key_usage: String,
    /// The key policy's statements (a `Resource: "*"` there means this key).
    pub policy: Vec<StatementDef>,
}

/// An event that invokes a function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventDef {
    Api {
        method: String,
        path: String,
    },
    /// A route of an HTTP API (`AWS::Serverless::HttpApi`: the approval page's public API).
    HttpApi {
        method: String,
        path: String,
    },
    Sqs {
        queue: String,
    },
    Schedule,
    Other(String),
}

/// An `AWS::Serverless::Function`, with `Globals.Function` applied.
#[derive(Debug, Clone)]
pub struct FunctionDef {
    pub logical_id: String,
    pub build_method: Option<String>,
    /// `Metadata.BuildProperties.Binary`: the workspace binary to build.
    pub binary: Option<String>,
    pub runtime: Option<String>,
    pub handler: Option<String>,
    pub architectures: Vec<String>,
    pub timeout_s: Option<u32>,
    /// Environment variables (globals, then the function's own), values as written.
    pub env: BTreeMap<String, Value>,
    pub events: Vec<EventDef>,
    /// Logical id of the execution role (`Role: !GetAtt X.Arn`).
    pub role: Option<String>,
    /// Logical id of the log group it writes (`LoggingConfig.LogGroup: !Ref X`).
    pub log_group: Option<String>,
    /// `Tracing` as written (the function's own, else `Globals.Function`'s).
    pub tracing: Option<Value>,
    /// `ReservedConcurrentExecutions` as written.
    pub reserved_concurrency: Option<Value>,
}

/// A resource an IAM statement names, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResourceDef {
    /// `!GetAtt X.Arn` (no suffix), or `!Sub "${X.Arn}/index/*"` (suffix `/index/*`).
    Arn { logical_id: String, suffix: String },
    /// `!If [condition, a, b]`: one of these, as the condition says.
    Either(Vec<ResourceDef>),
    /// A literal: `*`, or an ARN.
    Literal(String),
}

/// Who a key policy statement is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrincipalDef {
    /// `AWS: !GetAtt X.Arn`: the role X.
    Role(String),
    /// `AWS: arn:...:iam::ACCOUNT:root`: the account, which delegates to its IAM policies.
    Account,
    /// `AWS: "*"`.
    Anyone,
    /// Anything else (a service principal, a literal ARN).
    Other(String),
}

/// One statement of an IAM policy or a key policy.
#[derive(Debug, Clone)]
pub struct StatementDef {
    pub sid: Option<String>,
    /// `Allow` or `Deny`.
    pub effect: String,
    pub actions: Vec<String>,
    pub resources: Vec<ResourceDef>,
    /// Key policies only.
    pub principal: Option<PrincipalDef>,
    /// The `Condition` block as written, if any.
    pub condition: Option<Value>,
}

/// An `AWS::IAM::Role`: its inline policies' statements and its managed policies.
#[derive(Debug, Clone)]
pub struct RoleDef {
    pub logical_id: String,
    pub statements: Vec<StatementDef>,
    /// `ManagedPolicyArns` that are `!Ref` to a template `AWS::IAM::ManagedPolicy`.
    pub managed_policies: Vec<String>,
    /// `ManagedPolicyArns` given as ARNs (AWS managed policies), as written.
    pub external_policies: Vec<String>,
    /// The statements of inline policies written `!If [Condition, policy, !Ref
    /// AWS::NoValue]`, each with its condition: in force only when it holds, hence not in
    /// `statements` (what the role allows whatever the parameters say).
    pub conditional_statements: Vec<(String, StatementDef)>,
}

/// An `AWS::IAM::ManagedPolicy` of the template.
#[derive(Debug, Clone)]
pub struct ManagedPolicyDef {
    pub logical_id: String,
    pub statements: Vec<StatementDef>,
}

/// An `AWS::CloudWatch::Alarm`: its properties as written.
#[derive(Debug, Clone)]
pub struct AlarmDef {
    pub logical_id: String,
    pub properties: Value,
}

/// An `AWS::CloudWatch::Dashboard`.
#[derive(Debug, Clone)]
pub struct DashboardDef {
    pub logical_id: String,
    /// `DashboardBody` as written: JSON, or a `!Sub` pattern that is JSON once substituted.
    pub body_pattern: Option<String>,
}

/// What the template declares, in declaration order.
#[derive(Debug, Clone, Default)]
pub struct Template {
    pub tables: Vec<TableDef>,
    pub queues: Vec<QueueDef>,
    pub keys: Vec<KeyDef>,
    /// `AliasName` of each `AWS::KMS::Alias`, as written.
    pub key_aliases: Vec<String>,
    pub functions: Vec<FunctionDef>,
    pub roles: Vec<RoleDef>,
    pub managed_policies: Vec<ManagedPolicyDef>,
    /// Each parameter's `Default`, if it has one.
    pub parameters: BTreeMap<String, Option<String>>,
    /// Each parameter's `AllowedValues`, if it has them.
    pub allowed_values: BTreeMap<String, Vec<String>>,
    /// `Conditions`, as written.
    pub conditions: BTreeMap<String, Value>,
    pub alarms: Vec<AlarmDef>,
    pub dashboards: Vec<DashboardDef>,
}

impl Template {
    pub fn table(&self, logical_id: &str) -> Option<&TableDef> {
        self.tables.iter().find(|t| t.logical_id == logical_id)
    }

    pub fn queue(&self, logical_id: &str) -> Option<&QueueDef> {
        self.queues.iter().find(|q| q.logical_id == logical_id)
    }

    pub fn function(&self, logical_id: &str) -> Option<&FunctionDef> {
        self.functions.iter().find(|f| f.logical_id == logical_id)
    }

    pub fn role(&self, logical_id: &str) -> Option<&RoleDef> {
        self.roles.iter().find(|r| r.logical_id == logical_id)
    }

    pub fn managed_policy(&self, logical_id: &str) -> Option<&ManagedPolicyDef> {
        self.managed_policies
            .iter()
            .find(|p| p.logical_id == logical_id)
    }
}
