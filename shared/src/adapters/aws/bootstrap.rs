//! `airlock bootstrap`: creates the tables, indexes, queues and signing key of
//! [`shapes`](super::shapes) at the AWS endpoint of the environment (an emulator or a
//! sandbox account), under the default names `serve --backend aws` uses. Safe to run
//! twice: what exists is left as it is.

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TimeToLiveSpecification,
};
use aws_sdk_kms::types::{KeySpec, KeyUsageType};
use aws_sdk_sqs::types::QueueAttributeName;

use super::shapes::{self, QueueShape, Table};
use super::{aws_error, clients, sdk_config};

/// What bootstrap did, one line per resource.
pub type Report = Vec<String>;

fn key(name: &str, kind: KeyType) -> Result<KeySchemaElement, String> {
    KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(kind)
        .build()
        .map_err(|e| e.to_string())
}

fn attr(name: &str, kind: ScalarAttributeType) -> Result<AttributeDefinition, String> {
    AttributeDefinition::builder()
        .attribute_name(name)
        .attribute_type(kind)
        .build()
        .map_err(|e| e.to_string())
}

async fn create_table(
    ddb: &aws_sdk_dynamodb::Client,
    t: &Table,
    report: &mut Report,
) -> Result<(), String> {
    let name = t.name();
    if ddb.describe_table().table_name(&name).send().await.is_ok() {
        report.push(format!("table {name}: exists"));
        return Ok(());
    }
    let mut attrs = vec![attr(t.partition, ScalarAttributeType::S)?];
    let mut schema = vec![key(t.partition, KeyType::Hash)?];
    if let Some(sort) = t.sort {
        attrs.push(attr(sort, ScalarAttributeType::S)?);
        schema.push(key(sort, KeyType::Range)?);
    }
    let mut req = ddb
        .create_table()
        .table_name(&name)
        .billing_mode(BillingMode::PayPerRequest)
        .set_key_schema(Some(schema));
    for ix in t.indexes {
        for (name, kind) in [
            (ix.partition, ScalarAttributeType::S),
            (
                ix.sort,
                if ix.sort_is_number {
                    ScalarAttributeType::N
                } else {
                    ScalarAttributeType::S
                },
            ),
        ] {
            if !attrs.iter().any(|a| a.attribute_name() == name) {
                attrs.push(attr(name, kind)?);
            }
        }
        req = req.global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(ix.name)
                .key_schema(key(ix.partition, KeyType::Hash)?)
                .key_schema(key(ix.sort, KeyType::Range)?)
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::All)
                        .build(),
                )
                .build()
                .map_err(|e| e.to_string())?,
        );
    }
    req.set_attribute_definitions(Some(attrs))
        .send()
        .await
        .map_err(|e| format!("CreateTable {name}: {}", aws_error(&e)))?;
    if let Some(ttl) = t.ttl {
        ddb.update_time_to_live()
            .table_name(&name)
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

async fn create_queue(
    sqs: &aws_sdk_sqs::Client,
    q: &QueueShape,
    report: &mut Report,
) -> Result<(), String> {
    let fifo = |req: aws_sdk_sqs::operation::create_queue::builders::CreateQueueFluentBuilder| {
        if q.fifo {
            req.attributes(QueueAttributeName::FifoQueue, "true")
                .attributes(QueueAttributeName::ContentBasedDeduplication, "false")
        } else {
            req
        }
    };
    let (name, dead) = (q.name(), q.dead_letter());
    let dlq = fifo(sqs.create_queue().queue_name(&dead))
        .attributes(QueueAttributeName::MessageRetentionPeriod, "1209600")
        .send()
        .await
        .map_err(|e| format!("CreateQueue {dead}: {}", aws_error(&e)))?;
    let dlq_arn = queue_arn(sqs, dlq.queue_url().unwrap_or_default()).await?;
    let redrive = serde_json::json!({ "deadLetterTargetArn": dlq_arn, "maxReceiveCount": q.max_receive_count.to_string() });
    fifo(sqs.create_queue().queue_name(&name))
        .attributes(QueueAttributeName::RedrivePolicy, redrive.to_string())
        .attributes(QueueAttributeName::VisibilityTimeout, "60")
        .send()
        .await
        .map_err(|e| format!("CreateQueue {name}: {}", aws_error(&e)))?;
    report.push(format!("queue {name} (dead letters: {dead}): ready"));
    Ok(())
}

async fn create_key(kms: &aws_sdk_kms::Client, report: &mut Report) -> Result<(), String> {
    let alias = shapes::default_signing_alias();
    if kms.describe_key().key_id(&alias).send().await.is_ok() {
        report.push(format!("key {alias}: exists"));
        return Ok(());
    }
    let key = kms
        .create_key()
        .key_spec(KeySpec::EccNistP256)
        .key_usage(KeyUsageType::SignVerify)
        .description("Airlock confirmation-token signing key")
        .send()
        .await
        .map_err(|e| format!("CreateKey: {}", aws_error(&e)))?;
    let id = key
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
pub async fn bootstrap() -> Result<Report, String> {
    let conf = sdk_config().await;
    let (ddb, sqs, kms) = clients(&conf);
    let mut report = Report::new();
    for t in shapes::TABLES {
        create_table(&ddb, t, &mut report).await?;
    }
    for q in shapes::QUEUES {
        create_queue(&sqs, q, &mut report).await?;
    }
    create_key(&kms, &mut report).await?;
    Ok(report)
}
