//! The SAM template, `infra/template.yaml`, read as data: the single source of truth for the
//! AWS resource shapes. `airlock bootstrap` creates tables, indexes, TTL attributes, queues
//! and the signing key from it (see [`bootstrap`](super::bootstrap)), and the tests
//! (`tests.rs`) check it against what the code expects ([`shapes`](super::shapes)): keys,
//! indexes, TTL attributes, queues, the key, and the environment of every function; and the
//! observability side (the dashboard, the metric alarms, X-Ray tracing) against the metrics
//! the functions emit.
//!
//! CloudFormation's short-form tags (`!Ref`, `!Sub`, `!GetAtt`, `!If`, ...) and their long
//! forms (`Ref:`, `Fn::Sub:`, ...) are both understood, as far as this module needs them.
//! [`model`] holds what is read, [`yaml`] the reading of values and intrinsics,
//! [`resources`] tables, queues and functions, [`policies`] IAM and key policies, and
//! [`conditions`] the evaluation of `Conditions`.

mod conditions;
mod model;
mod policies;
mod resources;
mod yaml;

use serde_yaml::{Mapping, Value};

pub use model::{
    AlarmDef, AttrType, DashboardDef, EventDef, FunctionDef, IndexDef, KeyDef, KeySchema,
    ManagedPolicyDef, PrincipalDef, QueueDef, Redrive, ResourceDef, RoleDef, StatementDef,
    TableDef, Template,
};
pub use policies::policy_document;
pub use yaml::{intrinsic, referenced_id, string_or_sub};

use policies::{role, statements};
use resources::{function, queue, table};
use yaml::{field, seq, text};

/// The template, embedded at compile time.
pub const TEMPLATE: &str = include_str!("../../../../../infra/template.yaml");

/// The embedded template, parsed.
pub fn embedded() -> Result<Template, String> {
    parse(TEMPLATE)
}

/// Parses a SAM template's resources.
pub fn parse(yaml: &str) -> Result<Template, String> {
    let doc: Value = serde_yaml::from_str(yaml).map_err(|e| format!("infra/template.yaml: {e}"))?;
    let resources: &Mapping = field(&doc, "Resources")
        .and_then(Value::as_mapping)
        .ok_or("infra/template.yaml: no Resources")?;
    let globals = field(&doc, "Globals").and_then(|g| field(g, "Function"));
    let mut t = Template::default();
    if let Some(params) = field(&doc, "Parameters").and_then(Value::as_mapping) {
        for (name, p) in params {
            if let Some(name) = name.as_str() {
                t.parameters.insert(name.to_string(), text(p, "Default"));
                if field(p, "AllowedValues").is_some() {
                    let values = seq(p, "AllowedValues")
                        .iter()
                        .filter_map(|v| match v {
                            Value::String(s) => Some(s.clone()),
                            Value::Number(n) => Some(n.to_string()),
                            Value::Bool(b) => Some(b.to_string()),
                            _ => None,
                        })
                        .collect();
                    t.allowed_values.insert(name.to_string(), values);
                }
            }
        }
    }
    if let Some(conditions) = field(&doc, "Conditions").and_then(Value::as_mapping) {
        for (name, c) in conditions {
            if let Some(name) = name.as_str() {
                t.conditions.insert(name.to_string(), c.clone());
            }
        }
    }
    for (id, res) in resources {
        let id = id
            .as_str()
            .ok_or("infra/template.yaml: a non-string logical id")?;
        let props = field(res, "Properties").unwrap_or(&Value::Null);
        let wrap = |e: String| format!("infra/template.yaml: {e}");
        match text(res, "Type").as_deref() {
            Some("AWS::DynamoDB::Table") => t.tables.push(table(id, props).map_err(wrap)?),
            Some("AWS::SQS::Queue") => t.queues.push(queue(id, props).map_err(wrap)?),
            Some("AWS::KMS::Key") => t.keys.push(KeyDef {
                logical_id: id.to_string(),
                key_spec: text(props, "KeySpec").unwrap_or_else(|| "SYMMETRIC_DEFAULT".into()),
                key_usage: text(props, "KeyUsage").unwrap_or_else(|| "ENCRYPT_DECRYPT".into()),
                policy: statements(field(props, "KeyPolicy"), &format!("{id}.KeyPolicy"))
                    .map_err(wrap)?,
            }),
            Some("AWS::IAM::Role") => t.roles.push(role(id, props).map_err(wrap)?),
            Some("AWS::IAM::ManagedPolicy") => t.managed_policies.push(ManagedPolicyDef {
                logical_id: id.to_string(),
                statements: statements(
                    field(props, "PolicyDocument"),
                    &format!("{id}.PolicyDocument"),
                )
                .map_err(wrap)?,
            }),
            Some("AWS::KMS::Alias") => {
                if let Some(name) = field(props, "AliasName").and_then(string_or_sub) {
                    t.key_aliases.push(name);
                }
            }
            Some("AWS::Serverless::Function") => {
                t.functions.push(function(id, res, globals).map_err(wrap)?);
            }
            Some("AWS::CloudWatch::Alarm") => t.alarms.push(AlarmDef {
                logical_id: id.to_string(),
                properties: props.clone(),
            }),
            Some("AWS::CloudWatch::Dashboard") => t.dashboards.push(DashboardDef {
                logical_id: id.to_string(),
                body_pattern: field(props, "DashboardBody").and_then(string_or_sub),
            }),
            _ => {}
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests;
