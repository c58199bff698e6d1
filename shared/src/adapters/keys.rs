//! Local key files in the state dir, created on first use with mode 0600.

use std::fs;
use std::io::Write;
use std::path::Path;

use p256::pkcs8::{DecodePrivateKey, EncodePrivateKey, LineEnding};

/// Loads a P-256 private key (PKCS#8 PEM) or creates one.
pub fn load_or_create_p256(path: &Path) -> Result<p256::SecretKey, String> {
    if path.exists() {
        let pem = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        return p256::SecretKey::from_pkcs8_pem(&pem)
            .map_err(|e| format!("{}: not a P-256 PKCS#8 key: {e}", path.display()));
    }
    let key = p256::SecretKey::random(&mut rand::rngs::OsRng);
    let pem = key
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| format!("encoding a new key: {e}"))?;
    write_private(path, pem.as_bytes())?;
    Ok(key)
}

/// Loads 32 random bytes (a MAC key) or creates them.
pub fn load_or_create_secret(path: &Path) -> Result<Vec<u8>, String> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    if path.exists() {
        let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        return b64
            .decode(text.trim())
            .map_err(|e| format!("{}: not base64: {e}", path.display()));
    }
    let mut bytes = vec![0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut bytes);
    write_private(path, b64.encode(&bytes).as_bytes())?;
    Ok(bytes)
}

/// Writes a file readable by its owner only, atomically (write to a temp file, rename), so
/// two processes starting at once both end up with the same key.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts
        .open(&tmp)
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    // hard_link fails if another process created the key first: keep theirs.
    let linked = fs::hard_link(&tmp, path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}
