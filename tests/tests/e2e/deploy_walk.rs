//! README's "Deploying to AWS", walked against the emulator: every shell block of that section
//! marked `<!-- emulator: NAME -->` runs as written, with its `<placeholders>` filled in, in
//! `bash` with a clean environment (the emulator's endpoint, credentials and region; `airlock`
//! and the AWS CLI v1 of `scripts/emulator.sh` on the `PATH`), and its effect is checked.
//! What cannot run without an AWS account (the VPC endpoint, `sam deploy`, the approval
//! domain's certificate and DNS) is listed in that section.
//!
//! The stack stands in for a deployed one: `airlock bootstrap` creates the resources the
//! template declares, under the prefix [`PREFIX`] (the stack's `ResourcePrefix`), as
//! `sam deploy` would; `airlock serve --backend aws` stands in for the stage's API.

use std::path::PathBuf;
use std::process::Command;

use airlock_tests::moto::Moto;
use airlock_tests::{Backend, Stack};
use aws_sdk_dynamodb::types::AttributeValue;
use base64::Engine;
use serde_json::Value;

const README: &str = include_str!("../../../README.md");

/// The stack's `ResourcePrefix`.
const PREFIX: &str = "walk-";
/// The approval page's origin (`ApprovalOrigin`, or `https://<ApprovalDomainName>`).
const ORIGIN: &str = "https://approvals.walk.example";

/// Every marked block of the deploy section, each walked by a test here.
const MARKED: [&str; 7] = [
    "operators-enroll",
    "confirmation-key",
    "demo-data",
    "check",
    "schedule-key-deletion",
    "kill-switch-cli",
    "kill-switch-aws-cli",
];

/// README's deploy section: from its heading to the next second-level heading.
fn deploy_section() -> &'static str {
    let start = README
        .find("\n## Deploying to AWS\n")
        .expect("README has a \"Deploying to AWS\" section");
    let rest = &README[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |i| i + 3);
    &rest[..end]
}

/// The `sh` block right after `<!-- emulator: NAME -->` in the deploy section, without the
/// indentation of a list item.
fn block(name: &str) -> String {
    let section = deploy_section();
    let marker = format!("<!-- emulator: {name} -->");
    assert_eq!(
        section.matches(&marker).count(),
        1,
        "README's deploy section must mark exactly one block {marker}"
    );
    let at = section.find(&marker).expect("marker");
    let mut lines = section[at + marker.len()..].lines().skip(1);
    let fence = lines.next().unwrap_or_default();
    assert_eq!(
        fence.trim(),
        "```sh",
        "{marker} must be followed by a ```sh block, found {fence:?}"
    );
    let indent = fence.len() - fence.trim_start().len();
    let mut code = String::new();
    for line in lines {
        if line.trim() == "```" {
            return code;
        }
        code.push_str(line.get(indent..).unwrap_or(line.trim_start()));
        code.push('\n');
    }
    panic!("{marker}: the block is not closed");
}

/// `code` with each placeholder replaced; every placeholder given must be in it, and none may
/// be left (a new placeholder in the README must be filled in here).
fn fill(code: &str, subs: &[(&str, &str)]) -> String {
    let mut out = code.to_string();
    for (from, to) in subs {
        assert!(
            out.contains(from),
            "the README block no longer has {from:?}:\n{code}"
        );
        out = out.replace(from, to);
    }
    // A placeholder: `<` and a letter, up to the next `>` on the line (not `<<<"$x"`).
    for (i, _) in out.match_indices('<') {
        let rest = &out[i + 1..];
        if !rest.starts_with(|c: char| c.is_ascii_alphabetic()) {
            continue;
        }
        let line = rest.split('\n').next().unwrap_or_default();
        if let Some(end) = line.find('>') {
            if !line[..end].contains('<') {
                panic!(
                    "placeholder <{}> of the README block is not filled in by the test:\n{code}",
                    &line[..end]
                );
            }
        }
    }
    out
}

/// What a script printed.
struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// A shell like a new engineer's: the emulator's AWS environment, `airlock` and `aws` on the
/// `PATH`, a working directory of its own, nothing else of the test process's environment.
struct Walk {
    dir: PathBuf,
    env: Vec<(String, String)>,
}

impl Walk {
    /// On `stack`'s emulator (its AWS variables only: no `AIRLOCK_BACKEND`, no prefix; the
    /// blocks say what they need).
    fn new(stack_env: &[(String, String)]) -> Walk {
        let dir = airlock_tests::temp_state_dir();
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).expect("bin dir");
        let aws = Moto::repo_root().join(".venv/awscli/bin/aws");
        assert!(
            aws.exists(),
            "{} is missing: run scripts/emulator.sh (the README's test command does)",
            aws.display()
        );
        std::os::unix::fs::symlink(airlock_tests::binary(), bin.join("airlock")).expect("link");
        std::os::unix::fs::symlink(&aws, bin.join("aws")).expect("link");
        let jq = Command::new("jq").arg("--version").output();
        assert!(
            jq.is_ok_and(|o| o.status.success()),
            "jq is missing: the README's AWS CLI recipe needs it (apt-get install jq)"
        );
        let mut env: Vec<(String, String)> = stack_env
            .iter()
            .filter(|(k, _)| k.starts_with("AWS_") || k.starts_with("AIRLOCK_AWS_"))
            .cloned()
            .collect();
        env.extend(
            [
                (
                    "PATH",
                    format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display()),
                ),
                ("HOME", dir.display().to_string()),
                ("USER", "walker".to_string()),
                ("LANG", "C.UTF-8".to_string()),
                ("RUST_LOG", "warn".to_string()),
            ]
            .map(|(k, v)| (k.to_string(), v)),
        );
        Walk { dir, env }
    }

    /// Runs `script` in `bash` (`set -euo pipefail`: a failing step fails the block) with
    /// `extra` environment.
    fn run(&self, script: &str, extra: &[(&str, &str)]) -> Out {
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!("set -euo pipefail\n{script}"))
            .current_dir(&self.dir)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .envs(extra.iter().copied())
            .output()
            .expect("run bash");
        Out {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// [`Walk::run`], which must succeed; returns stdout.
    fn ok(&self, script: &str, extra: &[(&str, &str)]) -> String {
        let out = self.run(script, extra);
        assert_eq!(
            out.code, 0,
            "failed:\n{script}\n--- stdout\n{}\n--- stderr\n{}",
            out.stdout, out.stderr
        );
        out.stdout
    }

    /// An `airlock --backend aws` command on the prefixed stack (the test's own look).
    fn airlock(&self, args: &str) -> String {
        self.ok(
            &format!("airlock --backend aws {args}"),
            &[("AIRLOCK_RESOURCE_PREFIX", PREFIX)],
        )
    }
}

impl Drop for Walk {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The test's own look at the emulator (the SDK: quicker than the AWS CLI).
struct Sdk {
    ddb: aws_sdk_dynamodb::Client,
    kms: aws_sdk_kms::Client,
}

impl Sdk {
    async fn new(stack: &Stack) -> Sdk {
        let config =
            airlock_tests::emulator_config(stack.emulator_endpoint().expect("an emulator")).await;
        Sdk {
            ddb: aws_sdk_dynamodb::Client::new(&config),
            kms: aws_sdk_kms::Client::new(&config),
        }
    }

    /// Every item of the stack's control table, by id: (id, version, trade_execute_enabled,
    /// body).
    async fn control_items(&self) -> Vec<(String, String, bool, String)> {
        let scan = self
            .ddb
            .scan()
            .table_name(format!("{PREFIX}airlock-control"))
            .consistent_read(true)
            .send()
            .await
            .expect("scan the control table");
        let text = |i: &std::collections::HashMap<String, AttributeValue>, k: &str| match i.get(k) {
            Some(AttributeValue::S(v)) | Some(AttributeValue::N(v)) => v.clone(),
            _ => String::new(),
        };
        let mut items: Vec<_> = scan
            .items()
            .iter()
            .map(|i| {
                (
                    text(i, "id"),
                    text(i, "version"),
                    matches!(
                        i.get("trade_execute_enabled"),
                        Some(AttributeValue::Bool(true))
                    ),
                    text(i, "body"),
                )
            })
            .collect();
        items.sort();
        items
    }

    /// How many items a table of the stack holds.
    async fn count(&self, table: &str) -> i32 {
        self.ddb
            .scan()
            .table_name(format!("{PREFIX}{table}"))
            .select(aws_sdk_dynamodb::types::Select::Count)
            .send()
            .await
            .expect("count")
            .count()
    }

    /// A key's ARN.
    async fn key_arn(&self, key: &str) -> String {
        let d = self.kms.describe_key().key_id(key).send().await;
        let meta = d.expect("describe the key").key_metadata.expect("metadata");
        meta.arn.expect("an ARN")
    }

    /// A key's state (`Enabled`, `PendingDeletion`).
    async fn key_state(&self, key: &str) -> String {
        let d = self.kms.describe_key().key_id(key).send().await;
        let meta = d.expect("describe the key").key_metadata.expect("metadata");
        meta.key_state.expect("a state").as_str().to_string()
    }

    /// A key's public key, base64 DER (the PEM's body).
    async fn public_key(&self, key: &str) -> String {
        let p = self.kms.get_public_key().key_id(key).send().await;
        let der = p.expect("the public key").public_key.expect("bytes");
        base64::engine::general_purpose::STANDARD.encode(der.as_ref())
    }
}

/// A stack whose resources exist, as after `sam deploy` (no demo data).
async fn deployed() -> (Stack, Walk, Sdk) {
    let stack = Stack::new(Backend::Aws);
    stack.cli(&[("AIRLOCK_RESOURCE_PREFIX", PREFIX)], &["bootstrap"]);
    let walk = Walk::new(&stack.env());
    let sdk = Sdk::new(&stack).await;
    (stack, walk, sdk)
}

/// Every marked block is walked by a test here, and every block walked here is marked.
#[test]
fn every_marked_block_is_walked() {
    let mut marked: Vec<&str> = deploy_section()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("<!-- emulator: "))
        .map(|m| m.strip_suffix(" -->").expect("a marker ends with -->"))
        .collect();
    marked.sort_unstable();
    let mut walked = MARKED.to_vec();
    walked.sort_unstable();
    assert_eq!(marked, walked, "README's marked blocks against this file's");
    for name in MARKED {
        assert!(!block(name).trim().is_empty(), "{name}: empty block");
    }
}

/// First deploy, steps 6 and 7, and a sandbox's demo data.
#[tokio::test]
async fn first_deploy_steps_enrol_an_operator_print_the_public_key_and_load_demo_data() {
    let (_stack, w, sdk) = deployed().await;

    // The sandbox's demo data: the stack's resources are found, none created.
    let out = w.ok(&fill(&block("demo-data"), &[("<prefix>", PREFIX)]), &[]);
    let lines: Vec<&str> = out.lines().collect();
    let resources: Vec<&&str> = lines.iter().filter(|l| !l.starts_with("demo")).collect();
    assert!(resources.len() >= 16, "{out}");
    for l in &resources {
        assert!(
            l.contains(PREFIX) && l.ends_with(": exists"),
            "the stack's resource is found, not created: {l}\n{out}"
        );
    }
    assert_eq!(lines.last(), Some(&"demo data: loaded"), "{out}");
    assert!(sdk.count("airlock-accounts").await > 0);

    // Step 6: an enrolment link under the approval page's origin, for the operator named.
    let prefix = [("AIRLOCK_RESOURCE_PREFIX", PREFIX)];
    let out = w.ok(
        &fill(&block("operators-enroll"), &[("<origin>", ORIGIN)]),
        &prefix,
    );
    let link = out.trim();
    let token = link
        .strip_prefix(&format!("{ORIGIN}/approvals/enroll/"))
        .unwrap_or_else(|| panic!("the link is under {ORIGIN}/approvals/enroll/: {out}"));
    assert!(token.len() >= 32, "{link}");
    let list = w.airlock("operators list");
    assert!(
        list.lines()
            .any(|l| l.starts_with("ID\troles=trader\tdesks=DESK\tpasskeys=0")),
        "{list}"
    );

    // Step 7: one line of base64 that the execute function takes as its public key, and
    // that is the signing key's (the alias the stack names).
    let out = w.run(&block("confirmation-key"), &prefix);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let key = out.stdout;
    assert!(
        !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+/=".contains(c)),
        "one line of base64 (ConfirmationPublicKey's AllowedPattern): {key:?}"
    );
    airlock::core::token::parse_public_key(&key)
        .unwrap_or_else(|e| panic!("AIRLOCK_CONFIRMATION_PUBLIC_KEY refuses {key:?}: {e}"));
    let alias = format!("alias/{PREFIX}airlock-confirmation");
    assert_eq!(key, sdk.public_key(&alias).await);
}

/// "Rotating the signing key": after the deploy that moves the alias to the other slot's
/// key, step 7 prints the new key's public key, and step 3 schedules the old key's deletion.
#[tokio::test]
async fn key_rotation_prints_the_new_public_key_and_deletes_the_old_key() {
    let (_stack, w, sdk) = deployed().await;
    let prefix = [("AIRLOCK_RESOURCE_PREFIX", PREFIX)];
    let alias = format!("alias/{PREFIX}airlock-confirmation");
    let old = sdk.key_arn(&alias).await;
    let before = w.ok(&block("confirmation-key"), &prefix);

    // CloudFormation's part of step 1 (SigningKeySlot=B): a new key, the alias moved to it.
    let created = sdk
        .kms
        .create_key()
        .key_spec(aws_sdk_kms::types::KeySpec::EccNistP256)
        .key_usage(aws_sdk_kms::types::KeyUsageType::SignVerify)
        .send()
        .await
        .expect("create the other slot's key");
    let new = created.key_metadata.expect("metadata").arn.expect("an ARN");
    sdk.kms
        .update_alias()
        .alias_name(&alias)
        .target_key_id(&new)
        .send()
        .await
        .expect("move the alias");
    let after = w.ok(&block("confirmation-key"), &prefix);
    assert_ne!(
        before, after,
        "step 7 after the rotation prints the new key"
    );
    assert_eq!(after, sdk.public_key(&new).await);

    // Step 3. AWS takes the key's ARN or id; moto (5.2.5) looks ScheduleKeyDeletion's key up
    // by id only, so the emulator gets the id of the old SigningKeyArn.
    let old_id = old.rsplit('/').next().expect("key id");
    w.ok(
        &fill(
            &block("schedule-key-deletion"),
            &[("<old SigningKeyArn>", old_id)],
        ),
        &[],
    );
    assert_eq!(sdk.key_state(&old).await, "PendingDeletion");
    assert_eq!(sdk.key_state(&new).await, "Enabled");
    assert_eq!(w.ok(&block("confirmation-key"), &prefix), after);
}

/// "Checking a deployed stage": the README's command passes against `airlock serve` on the
/// stack (workers off: nothing is queued by the check).
#[test]
fn checking_a_stage_passes_against_serve_on_the_stack() {
    let server = Stack::new(Backend::Aws).start(&[("AIRLOCK_RESOURCE_PREFIX", PREFIX)]);
    let w = Walk::new(&server.cli_env());
    let service = server.service_token();
    let operator = server.operator_token("op-energy-trader", "trader", Some("energy"));
    let script = fill(
        &block("check"),
        &[
            (
                "https://<api-id>.execute-api.<region>.amazonaws.com/<stage>",
                &server.base,
            ),
            ("<access token>", &service),
            ("<operator token>", &operator),
            ("<an account of the operator's desk>", "ACC-1"),
        ],
    );
    let table = w.ok(&script, &[]);
    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(w.dir.join("check-report.json")).expect("check-report.json"),
    )
    .expect("the JSON report");
    assert_eq!(report["failed"], 0, "{table}");
    assert!(report["passed"].as_u64() >= Some(20), "{table}");
    assert!(table.contains("read accounts"), "{table}");
}

/// "The kill switch in production", with only the AWS CLI and jq: the recipe engages and
/// releases it on a stack whose control record was never written, keeping every action
/// type's rollout mode and moving every copy of the record with it.
#[tokio::test]
async fn kill_switch_with_the_aws_cli_recipe() {
    let (_stack, w, sdk) = deployed().await;
    assert!(sdk.control_items().await.is_empty(), "never written");
    // The rollout modes, without the kill switch's lines.
    let rollout = || -> Vec<String> {
        let out = w.airlock("rollout");
        out.lines()
            .filter(|l| l.starts_with("rollout "))
            .map(String::from)
            .collect()
    };
    let modes = rollout();
    assert!(modes.len() >= 4, "{modes:?}");

    let engage = fill(
        &block("kill-switch-aws-cli"),
        &[(
            "<ControlTableName output>",
            &format!("{PREFIX}airlock-control"),
        )],
    );
    w.ok(&engage, &[]);
    let status = w.airlock("kill-switch status");
    assert!(status.contains("ENGAGED"), "{status}");
    assert!(status.contains("reason: incident 123"), "{status}");
    assert!(status.contains("by walker"), "{status}");
    assert_eq!(
        rollout(),
        modes,
        "the recipe keeps every action type's rollout mode (its default record is the CLI's)"
    );
    let items = sdk.control_items().await;
    assert_eq!(items.len(), 17, "global and its 16 copies: {items:?}");
    for (id, version, enabled, body) in &items {
        assert_eq!((version.as_str(), *enabled), ("1", false), "{id}");
        assert_eq!(body, &items[0].3, "{id} is a copy of the record");
    }

    // "Release the same way with ..."
    let release_how = "Release the same way with `.trade_execute_enabled=true | .reason=null`.";
    assert!(deploy_section().contains(release_how));
    let release = engage
        .replacen(
            ".trade_execute_enabled=false",
            ".trade_execute_enabled=true",
            1,
        )
        .replacen(".reason=$why", ".reason=null", 1);
    assert_ne!(release, engage);
    w.ok(&release, &[]);
    let status = w.airlock("kill-switch status");
    assert!(status.contains("released"), "{status}");
    for (id, version, enabled, _) in sdk.control_items().await {
        assert_eq!((version.as_str(), enabled), ("2", true), "{id}");
    }
}

/// "The kill switch in production", with `airlock`: engage pulls the demo's working orders,
/// status shows their cancels, release; every copy of the record follows.
#[tokio::test]
async fn kill_switch_with_airlock() {
    let (stack, w, sdk) = deployed().await;
    stack.cli(
        &[("AIRLOCK_RESOURCE_PREFIX", PREFIX)],
        &["bootstrap", "--demo-data"],
    );
    let out = w.ok(
        &fill(
            &block("kill-switch-cli"),
            &[
                ("<region>", Moto::REGION),
                ("<ResourcePrefix, often empty>", PREFIX),
            ],
        ),
        &[],
    );
    assert!(out.contains("ENGAGED"), "{out}");
    assert!(
        out.contains("cancel queued"),
        "the demo's working orders: {out}"
    );
    assert!(out.contains("cancels: pending="), "{out}");
    assert!(out.contains("released"), "{out}");
    let items = sdk.control_items().await;
    assert_eq!(items.len(), 17);
    for (id, version, enabled, _) in &items {
        assert!(*enabled, "{id}");
        assert_eq!(
            version, &items[0].1,
            "{id}: every copy at the record's version"
        );
    }
    assert!(items[0].1.parse::<u64>().expect("a version") >= 2);
}
