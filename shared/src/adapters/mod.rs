//! Adapters: the ports on real engines. `sqlite` is the embedded backend; `aws` the
//! DynamoDB, SQS and KMS one (with its bootstrap and the SAM template's checks);
//! `paper_broker` the broker the workers call; `local_signer` signs confirmation tokens
//! with a P-256 key file; `keys` keeps local key files.

pub mod aws;
pub mod dev_issuer;
pub mod http_client;
pub mod jwks_http;
pub mod keys;
pub mod local_signer;
pub mod paper_broker;
pub mod sqlite;
