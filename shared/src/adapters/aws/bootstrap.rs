//! `airlock bootstrap`: creates, at the AWS endpoint of the environment (an emulator or a
//! sandbox account), the tables, indexes, TTL attributes, queues and signing key that
//! `infra/template.yaml` declares (read through [`template`](super::template)), under the
//! default names `serve --backend aws` uses ([`shapes`](super::shapes): prefix + default
//! name, matched to the template by logical id). Safe to run twice: what exists is left as
//! it is. Deployment-only settings (point-in-time recovery, deletion protection, key
//! policies, encryption) are the stack's business, not the emulator's.

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TimeToLiveSpecification,
};
use aws_sdk_kms::types::{KeySpec, KeyUsageType};
use aws_sdk_sqs::types::QueueAttributeName;

use super::shapes::{self, QueueShape};
use super::template::{self, AttrType, KeyDef, KeySchema, QueueDef, TableDef, Template};
use super::{aws_error, clients, sdk_config};
use crate::config::AwsConfig;

/// What bootstrap did, one line per resource.
pub type Report = Vec<String>;

fn key_schema(k: &KeySchema) -> Result<Vec<KeySchemaElement>, String> {
    let mut out = vec![KeySchemaElement::builder()
        .attribute_name(&k.partition)
        .key_type(KeyType::Hash)
        .build()
        .map_err(|e| e.to_string())?];
    if let Some(sort) = &k.sort {
        out.push(
            KeySchemaElement::builder()
                .attribute_name(sort)
                .key_type(KeyType::Range)
                .build()
                .map_err(|e| e.to_string())?,
        );
    }
    Ok(out)
}

async fn create_table(
    ddb: &aws_sdk_dynamodb::Client,
    name: &str,
    t: &TableDef,
    report: &mut Report,
) -> Result<(), String> {
    if ddb.describe_table().table_name(name).send().await.is_ok() {
        report.push(format!("table {name}: exists"));
        return Ok(());
    }
    let billing = match t.billing_mode.as_deref() {
        Some("PAY_PER_REQUEST") => BillingMode::PayPerRequest,
        other => {
            return Err(format!(
                "{}: BillingMode {other:?}: only PAY_PER_REQUEST is supported",
                t.logical_id
            ))
        }
    };
    let mut attrs = Vec::new();
    for (attr, kind) in &t.attributes {
        attrs.push(
            AttributeDefinition::builder()
                .attribute_name(attr)
                .attribute_type(match kind {
                    AttrType::S => ScalarAttributeType::S,
                    AttrType::N => ScalarAttributeType::N,
                    AttrType::B => ScalarAttributeType::B,
                })
                .build()
                .map_err(|e| e.to_string())?,
        );
    }
    let mut req = ddb
        .create_table()
        .table_name(name)
        .billing_mode(billing)
        .set_key_schema(Some(key_schema(&t.key)?))
        .set_attribute_definitions(Some(attrs));
    for ix in &t.indexes {
        req = req.global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(&ix.name)
                .set_key_schema(Some(key_schema(&ix.key)?))
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::from(ix.projection.as_str()))
                        .build(),
                )
                .build()
                .map_err(|e| e.to_string())?,
        );
    }
    req.send()
        .await
        .map_err(|e| format!("CreateTable {name}: {}", aws_error(&e)))?;
    if let Some(ttl) = &t.ttl {
        ddb.update_time_to_live()
            .table_name(name)
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .attribute_name(ttl)
                    .enabled(true)
                    .build()
                    .map_err(|e| e.to_string())?,
            )
            .send()
            .await
            .map_err(|e| format!("UpdateTimeToLive {name}: {}", aws_error(&e)))?;
    }
    report.push(format!("table {name}: created"));
    Ok(())
}

async fn queue_arn(sqs: &aws_sdk_sqs::Client, url: &str) -> Result<String, String> {
    let out = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| format!("GetQueueAttributes {url}: {}", aws_error(&e)))?;
    out.attributes()
        .and_then(|a| a.get(&QueueAttributeName::QueueArn))
        .cloned()
        .ok_or_else(|| format!("no ARN for {url}"))
}

/// Creates one queue from its template definition (or finds it); returns its URL.
async fn ensure_queue(
    sqs: &aws_sdk_sqs::Client,
    name: &str,
    q: &QueueDef,
    redrive: Option<String>,
) -> Result<(String, bool), String> {
    if let Ok(found) = sqs.get_queue_url().queue_name(name).send().await {
        if let Some(url) = found.queue_url {
            return Ok((url, false));
        }
    }
    let mut req = sqs.create_queue().queue_name(name);
    if q.fifo {
        req = req
            .attributes(QueueAttributeName::FifoQueue, "true")
            .attributes(
                QueueAttributeName::ContentBasedDeduplication,
                q.content_based_deduplication.to_string(),
            );
    }
    if let Some(v) = q.visibility_timeout_s {
        req = req.attributes(QueueAttributeName::VisibilityTimeout, v.to_string());
    }
    if let Some(r) = q.retention_s {
        req = req.attributes(QueueAttributeName::MessageRetentionPeriod, r.to_string());
    }
    if let Some(policy) = redrive {
        req = req.attributes(QueueAttributeName::RedrivePolicy, policy);
    }
    let out = req
        .send()
        .await
        .map_err(|e| format!("CreateQueue {name}: {}", aws_error(&e)))?;
    Ok((out.queue_url.unwrap_or_default(), true))
}

async fn create_queue(
    sqs: &aws_sdk_sqs::Client,
    given: &AwsConfig,
    shape: &QueueShape,
    tpl: &Template,
    report: &mut Report,
) -> Result<(), String> {
    let q = tpl.queue(shape.logical_id).ok_or_else(|| {
        format!(
            "infra/template.yaml has no queue {} (shapes.rs)",
            shape.logical_id
        )
    })?;
    let (name, dead) = (shape.name(given), shape.dead_letter(given));
    let redrive = match &q.redrive {
        None => None,
        Some(r) => {
            let dlq = tpl.queue(&r.dead_letter).ok_or_else(|| {
                format!(
                    "infra/template.yaml: {}'s dead-letter queue {} is not a queue",
                    q.logical_id, r.dead_letter
                )
            })?;
            let (url, _) = ensure_queue(sqs, &dead, dlq, None).await?;
            let arn = queue_arn(sqs, &url).await?;
            Some(
                serde_json::json!({
                    "deadLetterTargetArn": arn,
                    "maxReceiveCount": r.max_receive_count.to_string(),
                })
                .to_string(),
            )
        }
    };
    let (_, created) = ensure_queue(sqs, &name, q, redrive).await?;
    report.push(format!(
        "queue {name} (dead letters: {dead}): {}",
        if created { "created" } else { "exists" }
    ));
    Ok(())
}

async fn create_key(
    kms: &aws_sdk_kms::Client,
    given: &AwsConfig,
    key: &KeyDef,
    report: &mut Report,
) -> Result<(), String> {
    let alias = shapes::default_signing_alias(given);
    if kms.describe_key().key_id(&alias).send().await.is_ok() {
        report.push(format!("key {alias}: exists"));
        return Ok(());
    }
    let created = kms
        .create_key()
        .key_spec(KeySpec::from(key.key_spec.as_str()))
        .key_usage(KeyUsageType::from(key.key_usage.as_str()))
        .description("Airlock confirmation-token signing key")
        .send()
        .await
        .map_err(|e| format!("CreateKey: {}", aws_error(&e)))?;
    let id = created
        .key_metadata()
        .map(|m| m.key_id().to_string())
        .ok_or("CreateKey returned no key id")?;
    kms.create_alias()
        .alias_name(&alias)
        .target_key_id(&id)
        .send()
        .await
        .map_err(|e| format!("CreateAlias: {}", aws_error(&e)))?;
    report.push(format!("key {alias} ({id}): created"));
    Ok(())
}

/// Creates every resource that does not exist yet.
pub async fn bootstrap(given: &AwsConfig) -> Result<Report, String> {
    let tpl = template::embedded()?;
    let conf = sdk_config(given).await;
    let (ddb, sqs, kms) = clients(&conf);
    let mut report = Report::new();
    for shape in shapes::TABLES {
        let def = tpl.table(shape.logical_id).ok_or_else(|| {
            format!(
                "infra/template.yaml has no table {} (shapes.rs)",
                shape.logical_id
            )
        })?;
        create_table(&ddb, &shape.name(given), def, &mut report).await?;
    }
    for shape in shapes::QUEUES {
        create_queue(&sqs, given, shape, &tpl, &mut report).await?;
    }
    // Rotation slots declare the same key twice; any one of them is the shape.
    let key = tpl
        .keys
        .first()
        .ok_or("infra/template.yaml declares no KMS key")?;
    create_key(&kms, given, key, &mut report).await?;
    Ok(report)
}
