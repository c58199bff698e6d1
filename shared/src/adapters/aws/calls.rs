//! The IAM permissions each AWS call needs, derived from the operation's typed input (the
//! tables, indexes, queues and keys it names), and a test-only log of them.
//!
//! The permission proof (`tests/tests/e2e/permissions.rs`) runs the real function binaries
//! against the emulator with [`CALL_LOG_ENV`] set, then checks every logged permission
//! against the function's role in `infra/template.yaml`, and every grant of the role
//! against the log. The emulator enforces no IAM, so this is how a deploy that cannot work
//! (a missing grant) or a role that allows more than the code does is caught before AWS.
//!
//! IAM evaluates each request per action and resource; the rules mirrored here:
//! `TransactWriteItems` needs `PutItem` / `UpdateItem` / `DeleteItem` /
//! `ConditionCheckItem` per item on that item's table, `TransactGetItems` `GetItem` per
//! table, `BatchGetItem` and `BatchWriteItem` their own action per table named; a `Query`
//! or `Scan` of an index is authorized on `TABLE/index/INDEX`; SQS actions on the queue
//! (its name, the last segment of the URL); KMS actions on the key as the code names it
//! (id, ARN or `alias/...`; `CreateAlias` also on the target key). A call on nothing the
//! code can name (`CreateKey`, an operation not listed here) is logged on `*`, which no
//! role of the template grants, so the proof fails until it is handled here.
//!
//! Resources are names, not ARNs: `TABLE`, `TABLE/index/INDEX`, `QUEUE`, the key id.

use std::io::Write;
use std::sync::OnceLock;

use aws_smithy_runtime_api::client::interceptors::context::Input;

/// **Test-only.** A file to append one JSON line per IAM permission each AWS call of this
/// process needs: `{"function": <binary name>, "action": "dynamodb:PutItem", "resource":
/// "airlock-plans"}`. Read once, at the first call; unset (always, in a deployment), the
/// recorder costs one check per call. Set by the permission proof only.
pub const CALL_LOG_ENV: &str = "AIRLOCK_AWS_CALL_LOG";

/// One IAM permission: the action (`dynamodb:GetItem`) and the resource it is checked on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Permission {
    pub action: String,
    pub resource: String,
}

/// The `$field()` of an operation's input, when the input is a `$input_type`.
macro_rules! field {
    ($input:expr, $input_type:ty, $field:ident) => {
        $input
            .downcast_ref::<$input_type>()
            .and_then(|i| i.$field())
    };
}

/// One permission per table a batch names.
fn per_table<'a>(op: &str, tables: Option<impl Iterator<Item = &'a String>>) -> Vec<Permission> {
    match tables {
        Some(ts) => ts.map(|t| permission("dynamodb", op, Some(t))).collect(),
        None => vec![permission("dynamodb", op, None)],
    }
}

fn permission(prefix: &str, op: &str, resource: Option<&str>) -> Permission {
    Permission {
        action: format!("{prefix}:{op}"),
        resource: resource.unwrap_or("*").to_string(),
    }
}

/// The IAM permissions operation `operation` of `service` (the SDK's metadata names:
/// `DynamoDB`, `SQS`, `KMS`) needs for this input.
pub fn permissions(service: &str, operation: &str, input: &Input) -> Vec<Permission> {
    match service {
        "DynamoDB" => dynamodb(operation, input),
        "SQS" => sqs(operation, input),
        "KMS" => kms(operation, input),
        other => vec![permission(&other.to_ascii_lowercase(), operation, None)],
    }
}

fn dynamodb(op: &str, input: &Input) -> Vec<Permission> {
    use aws_sdk_dynamodb::operation as o;
    let one = |table: Option<&str>| vec![permission("dynamodb", op, table)];
    let index = |table: Option<&str>, index: Option<&str>| {
        let resource = match (table, index) {
            (Some(t), Some(i)) => Some(format!("{t}/index/{i}")),
            (t, None) => t.map(String::from),
            (None, Some(_)) => None,
        };
        vec![permission("dynamodb", op, resource.as_deref())]
    };
    let mut out = match op {
        "GetItem" => one(field!(input, o::get_item::GetItemInput, table_name)),
        "PutItem" => one(field!(input, o::put_item::PutItemInput, table_name)),
        "UpdateItem" => one(field!(input, o::update_item::UpdateItemInput, table_name)),
        "DeleteItem" => one(field!(input, o::delete_item::DeleteItemInput, table_name)),
        "DescribeTable" => one(field!(
            input,
            o::describe_table::DescribeTableInput,
            table_name
        )),
        "CreateTable" => one(field!(input, o::create_table::CreateTableInput, table_name)),
        "DescribeTimeToLive" => one(field!(
            input,
            o::describe_time_to_live::DescribeTimeToLiveInput,
            table_name
        )),
        "UpdateTable" => one(field!(input, o::update_table::UpdateTableInput, table_name)),
        "UpdateTimeToLive" => one(field!(
            input,
            o::update_time_to_live::UpdateTimeToLiveInput,
            table_name
        )),
        "Query" => match input.downcast_ref::<o::query::QueryInput>() {
            Some(i) => index(i.table_name(), i.index_name()),
            None => one(None),
        },
        "Scan" => match input.downcast_ref::<o::scan::ScanInput>() {
            Some(i) => index(i.table_name(), i.index_name()),
            None => one(None),
        },
        "BatchGetItem" => per_table(
            op,
            field!(input, o::batch_get_item::BatchGetItemInput, request_items).map(|m| m.keys()),
        ),
        "BatchWriteItem" => per_table(
            op,
            field!(
                input,
                o::batch_write_item::BatchWriteItemInput,
                request_items
            )
            .map(|m| m.keys()),
        ),
        "TransactWriteItems" => {
            match input.downcast_ref::<o::transact_write_items::TransactWriteItemsInput>() {
                Some(i) => i
                    .transact_items()
                    .iter()
                    .map(|item| {
                        let (action, table) = if let Some(p) = item.put() {
                            ("PutItem", p.table_name())
                        } else if let Some(u) = item.update() {
                            ("UpdateItem", u.table_name())
                        } else if let Some(d) = item.delete() {
                            ("DeleteItem", d.table_name())
                        } else if let Some(c) = item.condition_check() {
                            ("ConditionCheckItem", c.table_name())
                        } else {
                            ("TransactWriteItems", "*")
                        };
                        permission("dynamodb", action, Some(table))
                    })
                    .collect(),
                None => one(None),
            }
        }
        "TransactGetItems" => {
            match input.downcast_ref::<o::transact_get_items::TransactGetItemsInput>() {
                Some(i) => i
                    .transact_items()
                    .iter()
                    .map(|item| {
                        permission("dynamodb", "GetItem", item.get().map(|g| g.table_name()))
                    })
                    .collect(),
                None => one(None),
            }
        }
        _ => one(None),
    };
    out.sort();
    out.dedup();
    out
}

/// A queue's name: the last path segment of its URL.
fn queue_name(url: Option<&str>) -> Option<&str> {
    url.and_then(|u| u.trim_end_matches('/').rsplit('/').next())
        .filter(|n| !n.is_empty())
}

fn sqs(op: &str, input: &Input) -> Vec<Permission> {
    use aws_sdk_sqs::operation as o;
    let name = match op {
        "SendMessage" => queue_name(field!(input, o::send_message::SendMessageInput, queue_url)),
        "ReceiveMessage" => queue_name(field!(
            input,
            o::receive_message::ReceiveMessageInput,
            queue_url
        )),
        "DeleteMessage" => queue_name(field!(
            input,
            o::delete_message::DeleteMessageInput,
            queue_url
        )),
        "ChangeMessageVisibility" => queue_name(field!(
            input,
            o::change_message_visibility::ChangeMessageVisibilityInput,
            queue_url
        )),
        "GetQueueAttributes" => queue_name(field!(
            input,
            o::get_queue_attributes::GetQueueAttributesInput,
            queue_url
        )),
        "GetQueueUrl" => field!(input, o::get_queue_url::GetQueueUrlInput, queue_name),
        "CreateQueue" => field!(input, o::create_queue::CreateQueueInput, queue_name),
        _ => None,
    };
    vec![permission("sqs", op, name)]
}

fn kms(op: &str, input: &Input) -> Vec<Permission> {
    use aws_sdk_kms::operation as o;
    match op {
        "Sign" => vec![permission(
            "kms",
            op,
            input
                .downcast_ref::<o::sign::SignInput>()
                .and_then(|i| i.key_id()),
        )],
        "GetPublicKey" => vec![permission(
            "kms",
            op,
            input
                .downcast_ref::<o::get_public_key::GetPublicKeyInput>()
                .and_then(|i| i.key_id()),
        )],
        "DescribeKey" => vec![permission(
            "kms",
            op,
            input
                .downcast_ref::<o::describe_key::DescribeKeyInput>()
                .and_then(|i| i.key_id()),
        )],
        // Authorized on the alias and on the key it will name.
        "CreateAlias" => match input.downcast_ref::<o::create_alias::CreateAliasInput>() {
            Some(i) => vec![
                permission("kms", op, i.alias_name()),
                permission("kms", op, i.target_key_id()),
            ],
            None => vec![permission("kms", op, None)],
        },
        _ => vec![permission("kms", op, None)],
    }
}

struct CallLog {
    file: std::fs::File,
    function: String,
}

/// The log named by [`CALL_LOG_ENV`], opened once for appending; `None` when unset.
fn call_log() -> Option<&'static CallLog> {
    static LOG: OnceLock<Option<CallLog>> = OnceLock::new();
    LOG.get_or_init(|| {
        let path = std::env::var_os(CALL_LOG_ENV).filter(|p| !p.is_empty())?;
        let file = match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) => {
                tracing::error!(path = ?path, error = %e, "{CALL_LOG_ENV}: cannot open the call log");
                return None;
            }
        };
        let function = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "unknown".into());
        Some(CallLog { file, function })
    })
    .as_ref()
}

/// Appends the permissions of one call to the call log, if [`CALL_LOG_ENV`] names one.
/// Lines of one call share `pid` and `call` (this process's count of calls), and name the
/// operation: how many calls a request made can be counted (`BENCHMARKS.md`).
pub(super) fn record(service: &str, operation: &str, input: &Input) {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let Some(log) = call_log() else {
        return;
    };
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    for p in permissions(service, operation, input) {
        let mut line = serde_json::json!({
            "function": log.function,
            "action": p.action,
            "resource": p.resource,
            "operation": format!("{service}.{operation}"),
            "pid": std::process::id(),
            "call": call,
        })
        .to_string();
        line.push('\n');
        // One write of a short line to a file opened for appending: lines of concurrent
        // processes do not interleave.
        if let Err(e) = (&log.file).write_all(line.as_bytes()) {
            tracing::error!(error = %e, "{CALL_LOG_ENV}: cannot append to the call log");
        }
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::operation::query::QueryInput;
    use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsInput;
    use aws_sdk_dynamodb::types::{ConditionCheck, Put, TransactWriteItem, Update};

    use super::*;

    fn p(action: &str, resource: &str) -> Permission {
        Permission {
            action: action.into(),
            resource: resource.into(),
        }
    }

    #[test]
    fn a_transaction_needs_the_item_actions_on_each_items_table() {
        let put = Put::builder()
            .table_name("keys")
            .item("pk", aws_sdk_dynamodb::types::AttributeValue::S("k".into()))
            .build()
            .unwrap();
        let up = Update::builder()
            .table_name("rate")
            .key("id", aws_sdk_dynamodb::types::AttributeValue::S("o".into()))
            .update_expression("SET a = :a")
            .build()
            .unwrap();
        let cc = ConditionCheck::builder()
            .table_name("control")
            .key("id", aws_sdk_dynamodb::types::AttributeValue::S("g".into()))
            .condition_expression("attribute_exists(id)")
            .build()
            .unwrap();
        let input = TransactWriteItemsInput::builder()
            .transact_items(TransactWriteItem::builder().put(put).build())
            .transact_items(TransactWriteItem::builder().update(up).build())
            .transact_items(TransactWriteItem::builder().condition_check(cc).build())
            .build()
            .unwrap();
        assert_eq!(
            permissions("DynamoDB", "TransactWriteItems", &Input::erase(input)),
            vec![
                p("dynamodb:ConditionCheckItem", "control"),
                p("dynamodb:PutItem", "keys"),
                p("dynamodb:UpdateItem", "rate"),
            ]
        );
    }

    #[test]
    fn an_index_query_is_authorized_on_the_index() {
        let input = QueryInput::builder()
            .table_name("orders")
            .index_name("by_desk")
            .build()
            .unwrap();
        assert_eq!(
            permissions("DynamoDB", "Query", &Input::erase(input)),
            vec![p("dynamodb:Query", "orders/index/by_desk")]
        );
        let base = QueryInput::builder().table_name("audit").build().unwrap();
        assert_eq!(
            permissions("DynamoDB", "Query", &Input::erase(base)),
            vec![p("dynamodb:Query", "audit")]
        );
    }

    #[test]
    fn queues_by_name_keys_as_named_and_unknown_calls_on_everything() {
        let send = aws_sdk_sqs::operation::send_message::SendMessageInput::builder()
            .queue_url("http://127.0.0.1:5000/123456789012/x-airlock-jobs")
            .message_body("{}")
            .build()
            .unwrap();
        assert_eq!(
            permissions("SQS", "SendMessage", &Input::erase(send)),
            vec![p("sqs:SendMessage", "x-airlock-jobs")]
        );
        let sign = aws_sdk_kms::operation::sign::SignInput::builder()
            .key_id("alias/airlock-confirmation")
            .build()
            .unwrap();
        assert_eq!(
            permissions("KMS", "Sign", &Input::erase(sign)),
            vec![p("kms:Sign", "alias/airlock-confirmation")]
        );
        let other = Input::erase(QueryInput::builder().build().unwrap());
        assert_eq!(
            permissions("DynamoDB", "ListTables", &other),
            vec![p("dynamodb:ListTables", "*")]
        );
    }
}
