//! The AWS backend: DynamoDB for every store, SQS for the queues, KMS for signing.
//! Clients are built once (per cold start in Lambda) from the standard AWS environment;
//! `AWS_ENDPOINT_URL` points them at an emulator. Every SDK call is recorded against the
//! request being served (see `telemetry::record_call`), so request logs and tests can
//! count AWS calls per operation.

mod accounts;
mod actions;
mod approvals;
mod audit;
pub mod bootstrap;
pub mod calls;
mod control;
mod ddb;
mod jobs;
mod kms;
mod ledger;
mod limits;
mod orders;
mod paper;
mod plans;
mod positions;
mod queue;
mod read_models;
pub mod shapes;
mod tables;
pub mod template;
mod workers;

use std::sync::Arc;

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::BeforeSerializationInterceptorContextRef;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;

pub use kms::KmsSigner;

use crate::config::AwsConfig;
use crate::core::error::StoreError;

/// Records each SDK operation (`DynamoDB.TransactWriteItems`, `SQS.SendMessage`, ...), and
/// the IAM permissions it needs when the test-only call log is on (see [`calls`]).
#[derive(Debug, Default)]
pub struct CallRecorder;

impl Intercept for CallRecorder {
    fn name(&self) -> &'static str {
        "airlock-call-recorder"
    }

    // Once per operation (not per retry attempt); the operation's metadata is in the bag
    // by now, unlike at `read_before_execution`.
    fn read_before_serialization(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some(m) = cfg.load::<Metadata>() {
            crate::telemetry::record_call(m.service(), m.name());
            calls::record(m.service(), m.name(), context.input());
        }
        Ok(())
    }
}

/// Resolved resource names.
#[derive(Debug, Clone)]
pub struct Names {
    pub accounts: String,
    pub positions: String,
    pub exposures: String,
    pub orders: String,
    pub jobs: String,
    pub plans: String,
    pub idempotency: String,
    pub actions: String,
    pub audit: String,
    pub control: String,
    pub rate_limits: String,
    pub paper_broker: String,
    pub approvals: String,
    pub orders_queue_url: String,
    pub jobs_queue_url: String,
    pub signing_key_id: String,
    /// The resource prefix, before the dead-letter queues' names.
    pub dead_letter_prefix: String,
    /// The dead-letter queues' URLs when the configuration gives them (a deployment);
    /// else they are found by name.
    pub orders_dead_letter_url: Option<String>,
    pub jobs_dead_letter_url: Option<String>,
    /// The in-process consumer's long poll, seconds ([`AwsConfig::receive_wait_s`]).
    pub receive_wait_s: u64,
}

/// The AWS clients and the names of the resources they use.
#[derive(Clone)]
pub struct Aws {
    pub ddb: aws_sdk_dynamodb::Client,
    pub sqs: aws_sdk_sqs::Client,
    pub kms: aws_sdk_kms::Client,
    pub names: Arc<Names>,
}

/// Every call's limits (see [`AwsConfig`]): per attempt, for the call with its retries, and
/// to connect.
pub fn timeouts(c: &AwsConfig) -> aws_config::timeout::TimeoutConfig {
    aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(std::time::Duration::from_millis(c.attempt_timeout_ms))
        .operation_attempt_timeout(std::time::Duration::from_millis(c.attempt_timeout_ms))
        .operation_timeout(std::time::Duration::from_millis(c.operation_timeout_ms))
        .build()
}

/// The SDK configuration from the standard environment (credentials, region,
/// `AWS_ENDPOINT_URL`), with the standard retry mode (exponential backoff with jitter, at
/// most 3 attempts; throttling is retried like any transient error) inside the configured
/// call limits, and the SDK's stalled-stream protection off while the attempt timeout is
/// the shorter limit (see [`stalled_streams`]).
pub async fn sdk_config(c: &AwsConfig) -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .retry_config(aws_config::retry::RetryConfig::standard().with_max_attempts(3))
        .timeout_config(timeouts(c))
        .stalled_stream_protection(stalled_streams(c))
        .load()
        .await
}

/// The SDK's stalled-stream protection fails a call whose body moves no byte for its grace
/// period (20 s); the attempt timeout (1 s by default, at most 60 s) fails the whole attempt,
/// body included, sooner whenever it is the shorter of the two. Then the protection can
/// never fire first, and its throughput checks on every request and response body are
/// CPU for nothing (about a tenth of a millisecond per execute). Kept on for an attempt
/// timeout longer than its grace period.
pub fn stalled_streams(
    c: &AwsConfig,
) -> aws_config::stalled_stream_protection::StalledStreamProtectionConfig {
    use aws_config::stalled_stream_protection::StalledStreamProtectionConfig as Stalled;
    use aws_smithy_runtime_api::client::stalled_stream_protection::DEFAULT_GRACE_PERIOD;
    if std::time::Duration::from_millis(c.attempt_timeout_ms) <= DEFAULT_GRACE_PERIOD {
        Stalled::disabled()
    } else {
        Stalled::enabled().build()
    }
}

/// A single-item write (`PutItem`, `UpdateItem`, `DeleteItem`) refused with
/// `TransactionConflictException` because a transaction holds its item at that moment: it
/// was not applied and its conditions were not evaluated, so sending it again is safe. The
/// SDK does not retry this error by default; with this classifier it is retried like
/// throttling (standard mode: backoff with jitter, within the call's attempts and timeout).
/// Transactions report conflicts as cancellation reasons instead: see [`condition_failure`]
/// and [`tables`]' `transact_if`.
#[derive(Debug)]
pub struct SingleWriteConflict;

impl SingleWriteConflict {
    fn is_conflict(e: &aws_smithy_runtime_api::client::interceptors::context::Error) -> bool {
        use aws_sdk_dynamodb::operation::{
            delete_item::DeleteItemError, put_item::PutItemError, update_item::UpdateItemError,
        };
        matches!(
            e.downcast_ref::<PutItemError>(),
            Some(PutItemError::TransactionConflictException(_))
        ) || matches!(
            e.downcast_ref::<UpdateItemError>(),
            Some(UpdateItemError::TransactionConflictException(_))
        ) || matches!(
            e.downcast_ref::<DeleteItemError>(),
            Some(DeleteItemError::TransactionConflictException(_))
        )
    }
}

impl aws_smithy_runtime_api::client::retries::classifiers::ClassifyRetry for SingleWriteConflict {
    fn classify_retry(
        &self,
        ctx: &aws_smithy_runtime_api::client::interceptors::context::InterceptorContext,
    ) -> aws_smithy_runtime_api::client::retries::classifiers::RetryAction {
        use aws_smithy_runtime_api::client::retries::classifiers::RetryAction;
        match ctx.output_or_error() {
            Some(Err(e)) if e.as_operation_error().is_some_and(Self::is_conflict) => {
                RetryAction::transient_error()
            }
            _ => RetryAction::NoActionIndicated,
        }
    }

    fn name(&self) -> &'static str {
        "TransactionConflict on a single-item write"
    }
}

#[cfg(test)]
mod kms_retry_tests {
    use std::time::Duration;

    /// The KMS client retries a throttled `Sign` three times in all, with pauses that stay
    /// inside about 300 ms; the other clients keep the shared configuration.
    #[test]
    fn kms_retries_are_explicit_and_short() {
        let conf = aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("eu-west-1"))
            .retry_config(aws_config::retry::RetryConfig::standard().with_max_attempts(3))
            .build();
        let (ddb, _, kms) = super::clients(&conf);
        let r = kms.config().retry_config().expect("KMS retries");
        assert_eq!(r.mode(), aws_config::retry::RetryMode::Standard);
        assert_eq!(r.max_attempts(), super::KMS_ATTEMPTS);
        assert_eq!(r.initial_backoff(), Duration::from_millis(100));
        assert_eq!(r.max_backoff(), Duration::from_millis(200));
        // Pauses before the 2nd and 3rd attempts: at most 100 ms, then 200 ms.
        let most: Duration = (0..super::KMS_ATTEMPTS - 1)
            .map(|i| (r.initial_backoff() * 2u32.pow(i)).min(r.max_backoff()))
            .sum();
        assert_eq!(most, Duration::from_millis(300));
        let d = ddb.config().retry_config().expect("DynamoDB retries");
        assert_eq!(d.initial_backoff(), Duration::from_secs(1));
    }
}

#[cfg(test)]
mod stalled_stream_tests {
    use super::stalled_streams;
    use crate::config::AwsConfig;

    #[test]
    fn the_stalled_stream_check_is_off_only_while_the_attempt_timeout_fires_first() {
        let with = |ms| AwsConfig {
            attempt_timeout_ms: ms,
            operation_timeout_ms: ms,
            ..AwsConfig::default()
        };
        assert!(!stalled_streams(&AwsConfig::default()).is_enabled());
        assert!(!stalled_streams(&with(20_000)).is_enabled());
        assert!(stalled_streams(&with(20_001)).is_enabled());
        assert!(stalled_streams(&with(60_000)).is_enabled());
    }
}

#[cfg(test)]
mod conflict_tests {
    use super::SingleWriteConflict;
    use aws_sdk_dynamodb::operation::put_item::PutItemError;
    use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
    use aws_sdk_dynamodb::types::error::{
        ConditionalCheckFailedException, TransactionConflictException,
    };
    use aws_smithy_runtime_api::client::interceptors::context::{Error, Input, InterceptorContext};
    use aws_smithy_runtime_api::client::orchestrator::OrchestratorError;
    use aws_smithy_runtime_api::client::retries::classifiers::{ClassifyRetry, RetryAction};

    fn classify(e: Error) -> RetryAction {
        let mut ctx = InterceptorContext::new(Input::doesnt_matter());
        ctx.set_output_or_error(Err(OrchestratorError::operation(e)));
        SingleWriteConflict.classify_retry(&ctx)
    }

    #[test]
    fn a_single_write_refused_for_a_transaction_conflict_is_retried_and_nothing_else() {
        let conflict = || TransactionConflictException::builder().build();
        assert_eq!(
            classify(Error::erase(PutItemError::TransactionConflictException(
                conflict()
            ))),
            RetryAction::transient_error()
        );
        assert_eq!(
            classify(Error::erase(UpdateItemError::TransactionConflictException(
                conflict()
            ))),
            RetryAction::transient_error()
        );
        // A failed condition is an answer, never retried.
        assert_eq!(
            classify(Error::erase(PutItemError::ConditionalCheckFailedException(
                ConditionalCheckFailedException::builder().build()
            ))),
            RetryAction::NoActionIndicated
        );
    }
}

/// Attempts of a KMS call (a plan's `Sign`).
pub const KMS_ATTEMPTS: u32 = 3;

/// KMS's retries, explicit: standard mode (throttling, `KMSInternalException` and other
/// 5xx answers are retried; nothing else), [`KMS_ATTEMPTS`] attempts, jittered exponential
/// pauses from 100 ms, at most 200 ms. `Sign`'s quota is per second (ECC keys: 300 a second
/// per account and Region, shared by every plan that signs), so a throttled `Sign` is tried
/// again within the same second or the next, not after the standard mode's 1 s and 2 s
/// pauses (which the 2 s operation timeout cuts anyway): at most 300 ms of pauses, then the
/// plan answers 503 `upstream_unavailable` with nothing stored.
pub fn kms_retries() -> aws_config::retry::RetryConfig {
    aws_config::retry::RetryConfig::standard()
        .with_max_attempts(KMS_ATTEMPTS)
        .with_initial_backoff(std::time::Duration::from_millis(100))
        .with_max_backoff(std::time::Duration::from_millis(200))
}

/// Clients with the call recorder, sharing one SDK configuration (KMS with its own retries:
/// [`kms_retries`]).
pub fn clients(
    conf: &aws_config::SdkConfig,
) -> (
    aws_sdk_dynamodb::Client,
    aws_sdk_sqs::Client,
    aws_sdk_kms::Client,
) {
    let ddb = aws_sdk_dynamodb::config::Builder::from(conf)
        .interceptor(CallRecorder)
        .retry_classifier(SingleWriteConflict)
        .build();
    let sqs = aws_sdk_sqs::config::Builder::from(conf)
        .interceptor(CallRecorder)
        .build();
    let kms = aws_sdk_kms::config::Builder::from(conf)
        .interceptor(CallRecorder)
        .retry_config(kms_retries())
        .build();
    (
        aws_sdk_dynamodb::Client::from_conf(ddb),
        aws_sdk_sqs::Client::from_conf(sqs),
        aws_sdk_kms::Client::from_conf(kms),
    )
}

impl Names {
    /// Every name resolved from the configuration (or the defaults `airlock bootstrap`
    /// creates), with the two queue URLs.
    pub fn resolve(given: &AwsConfig, orders_queue_url: String, jobs_queue_url: String) -> Names {
        Names {
            accounts: shapes::ACCOUNTS.name(given),
            positions: shapes::POSITIONS.name(given),
            exposures: shapes::EXPOSURES.name(given),
            orders: shapes::ORDERS.name(given),
            jobs: shapes::JOBS.name(given),
            plans: shapes::PLANS.name(given),
            idempotency: shapes::IDEMPOTENCY.name(given),
            actions: shapes::ACTIONS.name(given),
            audit: shapes::AUDIT.name(given),
            control: shapes::CONTROL.name(given),
            rate_limits: shapes::RATE_LIMITS.name(given),
            paper_broker: shapes::PAPER_BROKER.name(given),
            approvals: shapes::APPROVALS.name(given),
            orders_queue_url,
            jobs_queue_url,
            signing_key_id: shapes::signing_key(given),
            dead_letter_prefix: given.resource_prefix.clone(),
            orders_dead_letter_url: given
                .given(shapes::ORDERS_QUEUE.dead_letter_env)
                .map(String::from),
            jobs_dead_letter_url: given
                .given(shapes::JOBS_QUEUE.dead_letter_env)
                .map(String::from),
            receive_wait_s: given.receive_wait_s,
        }
    }
}

/// A queue's URL: the one configured, else looked up by its (prefixed default) name.
pub async fn queue_url(
    sqs: &aws_sdk_sqs::Client,
    given: &AwsConfig,
    shape: shapes::QueueShape,
) -> Result<String, String> {
    if let Some(u) = given.given(shape.env) {
        return Ok(u.to_string());
    }
    let name = shape.name(given);
    sqs.get_queue_url()
        .queue_name(&name)
        .send()
        .await
        .map_err(|e| {
            format!(
                "{}: queue {name} not found ({}); run `airlock bootstrap`",
                shape.env,
                aws_error(&e)
            )
        })?
        .queue_url
        .ok_or_else(|| format!("{}: no URL for {name}", shape.env))
}

impl Aws {
    /// Connects with the configured names (the SAM template's variables), falling back to
    /// the default names `airlock bootstrap` creates. Queue URLs not given are looked up by
    /// name once.
    pub async fn connect(given: &AwsConfig) -> Result<Aws, String> {
        let conf = sdk_config(given).await;
        let (ddb, sqs, kms) = clients(&conf);
        let names = Names::resolve(
            given,
            queue_url(&sqs, given, shapes::ORDERS_QUEUE).await?,
            queue_url(&sqs, given, shapes::JOBS_QUEUE).await?,
        );
        Ok(Aws {
            ddb,
            sqs,
            kms,
            names: Arc::new(names),
        })
    }
}

/// A short description of an SDK error for logs: the service's error code, never a
/// credential or a request body.
pub fn aws_error<E, R>(e: &aws_sdk_dynamodb::error::SdkError<E, R>) -> String
where
    E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::fmt::Debug,
    R: std::fmt::Debug,
{
    use aws_sdk_dynamodb::error::SdkError;
    match e {
        SdkError::ServiceError(s) => {
            let err = s.err();
            format!(
                "{}: {}",
                err.code().unwrap_or("ServiceError"),
                err.message().unwrap_or("")
            )
        }
        SdkError::TimeoutError(_) => "timeout".into(),
        SdkError::DispatchFailure(_) => "dispatch failure (connection)".into(),
        SdkError::ResponseError(_) => "unparseable response".into(),
        SdkError::ConstructionFailure(_) => "request construction failure".into(),
        _ => "unknown SDK error".into(),
    }
}

/// Any SDK failure is a retryable 503 for the client; the code goes to the logs.
pub(crate) fn unavailable<E, R>(
    what: &str,
    e: &aws_sdk_dynamodb::error::SdkError<E, R>,
) -> StoreError
where
    E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::fmt::Debug,
    R: std::fmt::Debug,
{
    StoreError::Unavailable(format!("{what}: {}", aws_error(e)))
}

/// How a conditional write failed on its conditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ConditionFailure {
    /// A condition did not hold: of the transaction item at this index, or (`None`) of a
    /// single write.
    Condition(Option<usize>),
    /// Another transaction touched the same items (`TransactionConflict`).
    Conflict,
}

/// The one DynamoDB failure classifier. A failed condition, or a transaction cancelled only
/// because of failed conditions (`ConditionalCheckFailed`) or because another transaction
/// touched the same items (`TransactionConflict`): the caller reads again and decides
/// again. Anything else, including a cancellation that mixes in throttling or validation,
/// is `None`: an error, so the request answers 503 or the message is retried rather than
/// settled.
pub(super) fn condition_failure<E: aws_sdk_dynamodb::error::ProvideErrorMetadata + 'static, R>(
    e: &aws_sdk_dynamodb::error::SdkError<E, R>,
) -> Option<ConditionFailure> {
    use aws_sdk_dynamodb::error::SdkError;
    use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
    let SdkError::ServiceError(se) = e else {
        return None;
    };
    match se.err().code() {
        Some("ConditionalCheckFailedException") => Some(ConditionFailure::Condition(None)),
        Some("TransactionCanceledException") => {
            let any: &dyn std::any::Any = se.err();
            let Some(TransactWriteItemsError::TransactionCanceledException(tc)) =
                any.downcast_ref::<TransactWriteItemsError>()
            else {
                return None;
            };
            let reasons: Vec<(usize, &str)> = tc
                .cancellation_reasons()
                .iter()
                .enumerate()
                .filter_map(|(i, r)| r.code().map(|c| (i, c)))
                .filter(|(_, c)| *c != "None")
                .collect();
            if reasons.is_empty()
                || !reasons
                    .iter()
                    .all(|(_, c)| matches!(*c, "ConditionalCheckFailed" | "TransactionConflict"))
            {
                return None;
            }
            Some(
                match reasons.iter().find(|(_, c)| *c == "ConditionalCheckFailed") {
                    Some((i, _)) => ConditionFailure::Condition(Some(*i)),
                    None => ConditionFailure::Conflict,
                },
            )
        }
        _ => None,
    }
}

/// Whether the write failed on its conditions (see [`condition_failure`]).
pub(super) fn is_condition_failure<
    E: aws_sdk_dynamodb::error::ProvideErrorMetadata + 'static,
    R,
>(
    e: &aws_sdk_dynamodb::error::SdkError<E, R>,
) -> bool {
    condition_failure(e).is_some()
}
