//! Where requests enter: each door parses its own input, calls a use case in
//! [`crate::core::usecases`] and renders the answer. No door calls another.

pub mod approval_page;
pub mod catalog;
pub mod http;
pub mod mcp;
pub mod queue;
