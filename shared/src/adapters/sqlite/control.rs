//! The control record on SQLite (kill switch, rollout modes, policy), written at a version.

use super::rows::one_body;
use super::rows::Cached;
use super::{db_err, json_err, Sqlite};
use crate::core::error::StoreResult;
use crate::core::ports::ControlStore;
use crate::core::records::Control;
use async_trait::async_trait;
use rusqlite::Connection;

pub(super) fn load_control(c: &Connection) -> StoreResult<Control> {
    Ok(
        match one_body(c, "SELECT body FROM control WHERE id = ?", &[&1])? {
            Some(t) => serde_json::from_str(&t).map_err(json_err)?,
            None => Control::default(),
        },
    )
}

#[async_trait]
impl ControlStore for Sqlite {
    async fn get_control(&self) -> StoreResult<Control> {
        self.read(load_control).await
    }

    async fn put_control(&self, control: &Control, expected_version: u64) -> StoreResult<bool> {
        let text = serde_json::to_string(control).map_err(json_err)?;
        self.write(move |tx| {
            if load_control(tx)?.version != expected_version {
                return Ok(false);
            }
            tx.run(
                "INSERT OR REPLACE INTO control (id, body) VALUES (1, ?)",
                [text],
            )
            .map_err(db_err)?;
            Ok(true)
        })
        .await
    }
}
