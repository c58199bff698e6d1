//! The audit trail as evidence, on both backends: every record is linked into its
//! operator's hash chain, checkpoints sign the chains' heads, and `airlock audit verify`
//! re-hashes everything and names what was done to the store: records edited, deleted,
//! inserted or reordered straight in SQLite or DynamoDB (not through Airlock), and a
//! forged checkpoint. An untouched trail verifies, across racing writers and a restart.

use std::collections::HashMap;
use std::process::Command;

use airlock_tests::{both, emulator_config, Api, Backend, Server, MARKET_OPEN};
use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::Value;

const CHAIN: &str = "operator:op-energy-trader";

fn start(b: Backend) -> Server {
    Server::start_on(b, &[("AIRLOCK_NOW", MARKET_OPEN)])
}

/// `airlock audit verify --json`: whether it exited 0, and its report.
fn verify(s: &Server, extra: &[&str]) -> (bool, Value) {
    let mut cmd = Command::new(airlock_tests::binary());
    cmd.arg("--state-dir")
        .arg(&s.state_dir)
        .args(["audit", "verify", "--json"])
        .args(extra)
        .env_remove("AIRLOCK_NOW")
        .env("RUST_LOG", "warn");
    for (k, v) in s.cli_env() {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run airlock audit verify");
    let text = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "verify printed no report ({e}): {text} / {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), report)
}

fn problems(r: &Value) -> Vec<Value> {
    r["problems"].as_array().cloned().unwrap_or_default()
}

/// Plans (and one execute) by the trader: records on the trader's chain.
async fn trail(t: &Api, plans: usize) {
    let mut last = None;
    for _ in 0..plans {
        let p = t.plan_buy("CLF27", 1).await;
        assert_eq!(p.status, 200, "{:?}", p.body);
        last = Some(p);
    }
    if let Some(p) = last {
        let e = t.execute(&p, "audit-chain-key-1").await;
        assert_eq!(e.status, 202, "{:?}", e.body);
    }
}

/// Direct access to the stored records of one chain, by number, and their raw rows.
enum Raw {
    Sqlite(rusqlite::Connection),
    Ddb(aws_sdk_dynamodb::Client, String),
}

impl Raw {
    async fn open(s: &Server) -> Raw {
        match s.backend {
            Backend::Embedded => {
                let c = s.db();
                // What a writer holding the file can do: drop the append-only triggers and
                // the one-record-per-number index.
                c.execute_batch(
                    "DROP TRIGGER IF EXISTS audit_append_only_update; \
                     DROP TRIGGER IF EXISTS audit_append_only_delete; \
                     DROP INDEX IF EXISTS audit_chain;",
                )
                .unwrap();
                Raw::Sqlite(c)
            }
            Backend::Aws => {
                let env: HashMap<String, String> = s.cli_env().into_iter().collect();
                let conf = emulator_config(env["AWS_ENDPOINT_URL"].clone()).await;
                Raw::Ddb(aws_sdk_dynamodb::Client::new(&conf), "airlock-audit".into())
            }
        }
    }

    /// The record at `seq` of the trader's chain: its key (row id or item) and its body.
    async fn get(&self, seq: i64) -> (RawKey, Value) {
        match self {
            Raw::Sqlite(c) => c
                .query_row(
                    "SELECT seq, body FROM audit WHERE chain = ? AND chain_seq = ?",
                    rusqlite::params![CHAIN, seq],
                    |r| {
                        Ok((
                            RawKey::Row(r.get(0)?),
                            serde_json::from_str(&airlock_tests::stored_body(r, 1)?).unwrap(),
                        ))
                    },
                )
                .unwrap(),
            Raw::Ddb(ddb, table) => {
                let items = ddb
                    .scan()
                    .table_name(table)
                    .filter_expression("chain = :c AND chain_seq = :n")
                    .expression_attribute_values(":c", AttributeValue::S(CHAIN.into()))
                    .expression_attribute_values(":n", AttributeValue::N(seq.to_string()))
                    .send()
                    .await
                    .unwrap()
                    .items
                    .unwrap_or_default();
                let item = items.into_iter().next().expect("the record");
                let body = serde_json::from_str(item["body"].as_s().unwrap()).unwrap();
                (RawKey::Item(item), body)
            }
        }
    }

    /// Writes `body` as the stored body of the record at `key`.
    async fn set_body(&self, key: &RawKey, body: &Value) {
        match (self, key) {
            (Raw::Sqlite(c), RawKey::Row(id)) => {
                c.execute(
                    "UPDATE audit SET body = ? WHERE seq = ?",
                    rusqlite::params![body.to_string(), id],
                )
                .unwrap();
            }
            (Raw::Ddb(ddb, table), RawKey::Item(item)) => {
                let mut item = item.clone();
                item.insert("body".into(), AttributeValue::S(body.to_string()));
                ddb.put_item()
                    .table_name(table)
                    .set_item(Some(item))
                    .send()
                    .await
                    .unwrap();
            }
            _ => unreachable!(),
        }
    }

    async fn delete(&self, key: &RawKey) {
        match (self, key) {
            (Raw::Sqlite(c), RawKey::Row(id)) => {
                c.execute("DELETE FROM audit WHERE seq = ?", [id]).unwrap();
            }
            (Raw::Ddb(ddb, table), RawKey::Item(item)) => {
                ddb.delete_item()
                    .table_name(table)
                    .key("plan_id", item["plan_id"].clone())
                    .key("seq", item["seq"].clone())
                    .send()
                    .await
                    .unwrap();
            }
            _ => unreachable!(),
        }
    }

    /// Puts back a record deleted by [`Raw::delete`] (the row as it was).
    async fn restore(&self, key: &RawKey, copy: &RowCopy) {
        match (self, key, copy) {
            (Raw::Sqlite(c), RawKey::Row(id), RowCopy::Row(cols)) => {
                c.execute(
                    "INSERT INTO audit (seq, at, plan_id, action_id, body, chain, chain_seq, \
                     prev_hash, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    rusqlite::params![
                        id, cols.0, cols.1, cols.2, cols.3, cols.4, cols.5, cols.6, cols.7
                    ],
                )
                .unwrap();
            }
            (Raw::Ddb(ddb, table), RawKey::Item(item), _) => {
                ddb.put_item()
                    .table_name(table)
                    .set_item(Some(item.clone()))
                    .send()
                    .await
                    .unwrap();
            }
            _ => unreachable!(),
        }
    }

    fn copy(&self, key: &RawKey) -> RowCopy {
        match (self, key) {
            (Raw::Sqlite(c), RawKey::Row(id)) => RowCopy::Row(Box::new(
                c.query_row(
                    "SELECT at, plan_id, action_id, body, chain, chain_seq, prev_hash, hash \
                     FROM audit WHERE seq = ?",
                    [id],
                    |r| {
                        Ok((
                            r.get(0)?,
                            r.get(1)?,
                            r.get(2)?,
                            r.get(3)?,
                            r.get(4)?,
                            r.get(5)?,
                            r.get(6)?,
                            r.get(7)?,
                        ))
                    },
                )
                .unwrap(),
            )),
            _ => RowCopy::Item,
        }
    }

    /// Inserts a record: `body`, with the link (chain, number, previous hash, hash) of the
    /// record at `like` when given, else none.
    async fn insert(&self, body: &Value, like: Option<&RawKey>) {
        match self {
            Raw::Sqlite(c) => {
                let link: (Option<String>, Option<i64>, Option<String>, Option<String>) = match like
                {
                    Some(RawKey::Row(id)) => c
                        .query_row(
                            "SELECT chain, chain_seq, prev_hash, hash FROM audit WHERE seq = ?",
                            [id],
                            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                        )
                        .unwrap(),
                    _ => (None, None, None, None),
                };
                c.execute(
                    "INSERT INTO audit (at, plan_id, action_id, body, chain, chain_seq, \
                     prev_hash, hash) VALUES (?, ?, NULL, ?, ?, ?, ?, ?)",
                    rusqlite::params![
                        body["at"].as_i64(),
                        body["plan_id"].as_str(),
                        body.to_string(),
                        link.0,
                        link.1,
                        link.2,
                        link.3
                    ],
                )
                .unwrap();
            }
            Raw::Ddb(ddb, table) => {
                let mut item: HashMap<String, AttributeValue> = match like {
                    Some(RawKey::Item(i)) => i.clone(),
                    _ => HashMap::new(),
                };
                item.insert(
                    "plan_id".into(),
                    AttributeValue::S(body["plan_id"].as_str().unwrap().into()),
                );
                item.insert(
                    "seq".into(),
                    AttributeValue::S(format!(
                        "{:015}#{}",
                        body["at"].as_i64().unwrap(),
                        body["audit_id"].as_str().unwrap()
                    )),
                );
                item.insert("body".into(), AttributeValue::S(body.to_string()));
                ddb.put_item()
                    .table_name(table)
                    .set_item(Some(item))
                    .send()
                    .await
                    .unwrap();
            }
        }
    }

    async fn remove_inserted(&self, body: &Value) {
        match self {
            Raw::Sqlite(c) => {
                c.execute("DELETE FROM audit WHERE body = ?", [body.to_string()])
                    .unwrap();
            }
            Raw::Ddb(ddb, table) => {
                ddb.delete_item()
                    .table_name(table)
                    .key(
                        "plan_id",
                        AttributeValue::S(body["plan_id"].as_str().unwrap().into()),
                    )
                    .key(
                        "seq",
                        AttributeValue::S(format!(
                            "{:015}#{}",
                            body["at"].as_i64().unwrap(),
                            body["audit_id"].as_str().unwrap()
                        )),
                    )
                    .send()
                    .await
                    .unwrap();
            }
        }
    }

    /// Stores a checkpoint straight in the store.
    async fn put_checkpoint(&self, cp: &Value) {
        match self {
            Raw::Sqlite(c) => {
                c.execute(
                    "INSERT INTO audit_checkpoints (at, body) VALUES (?, ?)",
                    rusqlite::params![cp["at"].as_i64(), cp.to_string()],
                )
                .unwrap();
            }
            Raw::Ddb(ddb, table) => {
                ddb.put_item()
                    .table_name(table)
                    .item("plan_id", AttributeValue::S("#checkpoint".into()))
                    .item(
                        "seq",
                        AttributeValue::S(format!(
                            "{:015}#{}",
                            cp["at"].as_i64().unwrap(),
                            cp["checkpoint_id"].as_str().unwrap()
                        )),
                    )
                    .item("at", AttributeValue::N(cp["at"].to_string()))
                    .item("body", AttributeValue::S(cp.to_string()))
                    .send()
                    .await
                    .unwrap();
            }
        }
    }
}

#[derive(Clone)]
enum RawKey {
    Row(i64),
    Item(HashMap<String, AttributeValue>),
}

type Cols = (
    i64,
    Option<String>,
    Option<String>,
    rusqlite::types::Value,
    String,
    i64,
    String,
    String,
);

enum RowCopy {
    Row(Box<Cols>),
    Item,
}

/// Asserts that verify fails with exactly one problem of `kind`, naming `audit_id`.
fn assert_named(s: &Server, kind: &str, audit_id: &str) {
    let (ok, r) = verify(s, &[]);
    assert!(!ok, "verify passed a tampered trail: {r}");
    let p = problems(&r);
    assert!(
        p.iter()
            .any(|p| p["kind"] == kind && p["audit_id"] == audit_id),
        "expected {kind} naming {audit_id}: {r:#}"
    );
}

fn assert_verifies(s: &Server) -> Value {
    let (ok, r) = verify(s, &[]);
    assert!(ok, "an untouched trail does not verify: {r:#}");
    r
}

both!(an_untouched_trail_verifies_across_racing_writers_and_a_restart);
async fn an_untouched_trail_verifies_across_racing_writers_and_a_restart(b: Backend) {
    let s = start(b);
    let t = s.trader();
    // Sixteen writers race on one chain (the trader's), four more on another operator's.
    let other = Api::new(
        &s,
        s.service_token(),
        s.operator_token("op-energy-2", "trader", Some("energy")),
    );
    let mut tasks = Vec::new();
    for i in 0..20 {
        let api = if i < 16 { t.clone() } else { other.clone() };
        tasks.push(tokio::spawn(async move {
            let who = if i < 16 {
                "op-energy-trader"
            } else {
                "op-energy-2"
            };
            let p = api
                .post(
                    "/actions/plan",
                    &serde_json::json!({
                        "action_type": "order.submit.cl",
                        "payload": { "account_id": "ACC-1", "symbol": "CLF27", "side": "buy",
                                     "quantity": 1, "order_type": "market" },
                        "requested_by": who,
                    }),
                )
                .await;
            assert_eq!(p.status, 200, "{:?}", p.body);
            if i % 2 == 0 {
                let mut body = Api::execute_body(&p, &format!("race-{i}"));
                body["requested_by"] = who.into();
                let e = api.post("/actions/execute", &body).await;
                assert_eq!(e.status, 202, "{:?}", e.body);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let r = assert_verifies(&s);
    // Every record is in a chain: 16 + 8 on the trader's, 4 + 2 on the other's.
    assert_eq!(r["legacy"], 0, "{r:#}");
    let unanchored: HashMap<String, (u64, u64)> = r["unanchored"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            (
                u["chain"].as_str().unwrap().to_string(),
                (
                    u["from_seq"].as_u64().unwrap(),
                    u["to_seq"].as_u64().unwrap(),
                ),
            )
        })
        .collect();
    assert_eq!(unanchored[CHAIN], (1, 24), "{r:#}");
    assert_eq!(unanchored["operator:op-energy-2"], (1, 6), "{r:#}");

    // A checkpoint anchors everything; a restart and more writes leave it verified, the new
    // records unanchored.
    let cp: Value = serde_json::from_str(&s.cli(&["audit", "checkpoint"])).unwrap();
    assert_eq!(cp["format"], "airlock.audit.checkpoint.v1");
    assert_eq!(cp["records"].as_u64().unwrap(), 30, "{cp:#}");
    let r = assert_verifies(&s);
    assert!(r["unanchored"].as_array().unwrap().is_empty(), "{r:#}");
    assert_eq!(r["checkpoints"], 1);
    let stack = s.crash();
    let s = stack.start(&[("AIRLOCK_NOW", MARKET_OPEN)]);
    trail(&s.trader(), 2).await;
    let r = assert_verifies(&s);
    assert_eq!(r["unanchored"][0]["chain"], CHAIN, "{r:#}");
    assert_eq!(r["unanchored"][0]["from_seq"], 25, "{r:#}");
    assert_eq!(r["unanchored"][0]["to_seq"], 27, "{r:#}");

    // Exported checkpoints verify from a directory, and `--from` starts at one.
    let dir = s.state_dir.join("exported");
    let out = s.cli(&["audit", "export-checkpoints", dir.to_str().unwrap()]);
    assert!(out.starts_with("1 checkpoint(s) written"), "{out}");
    let file = std::fs::read_dir(&dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let (ok, r) = verify(&s, &["--checkpoints", dir.to_str().unwrap()]);
    assert!(ok, "{r:#}");
    assert_eq!(r["checkpoints"], 2);
    let (ok, r) = verify(&s, &["--from", file.to_str().unwrap()]);
    assert!(ok, "{r:#}");
}

both!(each_kind_of_tampering_is_named);
async fn each_kind_of_tampering_is_named(b: Backend) {
    let s = start(b);
    trail(&s.trader(), 5).await;
    s.cli(&["audit", "checkpoint"]);
    assert_verifies(&s);
    let raw = Raw::open(&s).await;

    // Edited: one field of record #3.
    let (k3, b3) = raw.get(3).await;
    let id3 = b3["audit_id"].as_str().unwrap().to_string();
    let mut edited = b3.clone();
    edited["request_id"] = Value::String("req_forged".into());
    raw.set_body(&k3, &edited).await;
    assert_named(&s, "edited", &id3);
    raw.set_body(&k3, &b3).await;
    assert_verifies(&s);

    // Deleted: record #3 (the next one is named, and the number).
    let (k4, b4) = raw.get(4).await;
    let copy = raw.copy(&k3);
    raw.delete(&k3).await;
    let (ok, r) = verify(&s, &[]);
    assert!(!ok);
    assert!(
        problems(&r)
            .iter()
            .any(|p| p["kind"] == "deleted" && p["seq"] == 3 && p["audit_id"] == b4["audit_id"]),
        "{r:#}"
    );
    raw.restore(&k3, &copy).await;
    assert_verifies(&s);

    // Inserted: a record in no chain, and a second record at #3.
    let mut fake = b3.clone();
    fake["audit_id"] = Value::String("aud_inserted_1".into());
    fake["reason"] = Value::String("inserted".into());
    raw.insert(&fake, None).await;
    assert_named(&s, "inserted", "aud_inserted_1");
    raw.remove_inserted(&fake).await;
    assert_verifies(&s);
    fake["audit_id"] = Value::String("aud_inserted_2".into());
    raw.insert(&fake, Some(&k3)).await;
    assert_named(&s, "inserted", "aud_inserted_2");
    raw.remove_inserted(&fake).await;
    assert_verifies(&s);

    // Reordered: records #3 and #4 swap places.
    raw.set_body(&k3, &b4).await;
    raw.set_body(&k4, &b3).await;
    assert_named(&s, "reordered", b4["audit_id"].as_str().unwrap());
    raw.set_body(&k3, &b3).await;
    raw.set_body(&k4, &b4).await;
    assert_verifies(&s);

    // A forged checkpoint: a stored one with another head, its signature kept.
    let exported = s.state_dir.join("cps");
    s.cli(&["audit", "export-checkpoints", exported.to_str().unwrap()]);
    let file = std::fs::read_dir(&exported)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut cp: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    cp["checkpoint_id"] = Value::String("ckp_forged".into());
    cp["chains"][0]["seq"] = Value::from(2);
    raw.put_checkpoint(&cp).await;
    let (ok, r) = verify(&s, &[]);
    assert!(!ok);
    assert!(
        problems(&r)
            .iter()
            .any(|p| p["kind"] == "forged_checkpoint" && p["location"] == "checkpoint ckp_forged"),
        "{r:#}"
    );
}
