//! `airlock audit`: an id's trail, and the trail as evidence: `verify` (every chain, every
//! checkpoint, exit status 1 when anything was tampered with), `checkpoint` (sign the
//! chains' heads now) and `export-checkpoints DIR` (one JSON file per checkpoint, for
//! storage the writers cannot change, e.g. S3 Object Lock).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use airlock::app::{self, AppState, Backend};
use airlock::config::Config;
use airlock::core::audit_chain::Checkpoint;
use airlock::core::usecases::audit::{self as audit_uc, verify::Report};
use clap::Subcommand;

#[derive(Subcommand)]
pub enum AuditCommand {
    /// Re-hash every audit chain and check every checkpoint's signature; name the first
    /// record edited, deleted, inserted or reordered. Exit status 0: the trail verifies;
    /// 1: it does not, or it could not be read. Progress goes to stderr.
    Verify {
        /// Start each chain of this checkpoint file (an exported copy) at its head instead
        /// of its first record; the checkpoint must verify.
        #[arg(long)]
        from: Option<PathBuf>,
        /// Also check the checkpoints of this directory (exported copies) against the
        /// trail.
        #[arg(long)]
        checkpoints: Option<PathBuf>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Sign and store a checkpoint of every chain's head now; prints it.
    Checkpoint,
    /// Write every stored checkpoint to DIR as `<checkpoint_id>.json` (existing files are
    /// left as they are).
    ExportCheckpoints { dir: PathBuf },
}

/// The state without the demo seed: these commands never write to a store they only read.
async fn state(cfg: Config, backend: Backend) -> Result<AppState, String> {
    let clock: airlock::core::clock::SharedClock =
        Arc::new(airlock::core::clock::OffsetClock::system());
    match backend {
        Backend::Aws => app::aws(cfg, clock, true).await,
        Backend::Embedded => app::embedded(cfg, clock).map(|(s, _)| s),
    }
}

fn read_checkpoint(path: &Path) -> Result<Checkpoint, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: not a checkpoint: {e}", path.display()))
}

fn read_dir(dir: &Path) -> Result<Vec<Checkpoint>, String> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    paths.iter().map(|p| read_checkpoint(p)).collect()
}

pub async fn run(cfg: Config, backend: Backend, cmd: AuditCommand) -> Result<(), String> {
    let state = state(cfg, backend).await?;
    let chains = state.ports.audit_chains.clone();
    let signer = state
        .ports
        .audit_signer
        .clone()
        .ok_or("no audit signing key is configured")?;
    match cmd {
        AuditCommand::Checkpoint => {
            let cp = audit_uc::checkpoint(chains.as_ref(), signer.as_ref(), state.clock.now_ms())
                .await
                .map_err(|e| e.to_string())?;
            outln!(
                "{}",
                serde_json::to_string_pretty(&cp).map_err(|e| e.to_string())?
            );
            Ok(())
        }
        AuditCommand::ExportCheckpoints { dir } => {
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let all = chains.checkpoints().await.map_err(|e| e.to_string())?;
            let mut written = 0;
            for cp in &all {
                let path = dir.join(format!("{}.json", cp.checkpoint_id));
                if path.exists() {
                    continue;
                }
                let text = serde_json::to_string_pretty(cp).map_err(|e| e.to_string())?;
                std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
                written += 1;
            }
            outln!(
                "{written} checkpoint(s) written to {} ({} stored)",
                dir.display(),
                all.len()
            );
            Ok(())
        }
        AuditCommand::Verify {
            from,
            checkpoints,
            json,
        } => {
            let key = signer.public_key().await.map_err(|e| e.to_string())?;
            let from = from.as_deref().map(read_checkpoint).transpose()?;
            let extra = match &checkpoints {
                Some(d) => read_dir(d)?,
                None => Vec::new(),
            };
            let started = std::time::Instant::now();
            let mut last = std::time::Instant::now();
            let mut progress = move |n: u64| {
                if last.elapsed().as_secs() >= 2 {
                    last = std::time::Instant::now();
                    eprintln!(
                        "airlock audit verify: {n} records read ({} s)",
                        started.elapsed().as_secs()
                    );
                }
            };
            let report = audit_uc::verify::verify(
                chains.as_ref(),
                &key,
                from.as_ref(),
                &extra,
                &mut progress,
            )
            .await
            .map_err(|e| format!("the trail could not be read: {e}"))?;
            print_report(&report, json)?;
            if report.ok() {
                Ok(())
            } else {
                Err(format!(
                    "the audit trail does not verify: {} problem(s)",
                    report.problems.len()
                ))
            }
        }
    }
}

fn print_report(r: &Report, json: bool) -> Result<(), String> {
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(r).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    outln!(
        "{} records in {} chains; {} checkpoints verified; {} legacy records (before the chains)",
        r.records,
        r.chains,
        r.checkpoints,
        r.legacy
    );
    for p in &r.problems {
        outln!(
            "TAMPERED {:?}: chain {} #{} record {} at {}: {}",
            p.kind,
            p.chain.as_deref().unwrap_or("-"),
            p.seq.map_or("-".to_string(), |s| s.to_string()),
            p.audit_id.as_deref().unwrap_or("-"),
            p.location.as_deref().unwrap_or("-"),
            p.detail
        );
    }
    for u in &r.unanchored {
        outln!(
            "unanchored: chain {} #{}..#{} (after its last checkpoint)",
            u.chain,
            u.from_seq,
            u.to_seq
        );
    }
    if r.ok() {
        outln!("verified");
    }
    Ok(())
}
