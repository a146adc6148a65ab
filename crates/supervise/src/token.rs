//! Job tokens: what a caller holds to read, cancel and download an export.
//! A token names the job's operation and carries an HMAC-SHA256 over the
//! operation, the principal that created the job and the access-policy
//! revision it was created under, keyed with the server's secret. So a
//! token shown by another principal, or after the policy changed, does not
//! verify, and a token cannot be made without the secret.
//!
//! The secret comes from `OPLEDGER_EXPORT_SECRET` (hex, at least 32 bytes)
//! or the artifact directory's `secret` file, generated on first use from
//! the OS's random source and created `0600`.

use crate::dir::ArtifactDir;
use crate::SuperviseError;
use hmac::{Hmac, Mac};
use opledger_domain::OperationId;
use sha2::Sha256;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;

type HmacSha256 = Hmac<Sha256>;

const PREFIX: &str = "exp1";
const SECRET_BYTES: usize = 32;

/// The server's signing key.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// The key from `OPLEDGER_EXPORT_SECRET`, else from the directory's
    /// `secret` file (made now when missing).
    pub fn load(dir: &ArtifactDir) -> Result<Secret, SuperviseError> {
        if let Ok(text) = std::env::var("OPLEDGER_EXPORT_SECRET") {
            let bytes = from_hex(text.trim())
                .filter(|bytes| bytes.len() >= SECRET_BYTES)
                .ok_or_else(|| {
                    SuperviseError::Token("OPLEDGER_EXPORT_SECRET must be at least 64 hex digits".to_string())
                })?;
            return Ok(Secret(bytes));
        }
        let path = dir.secret();
        let created = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path);
        match created {
            Ok(mut file) => {
                let mut bytes = vec![0u8; SECRET_BYTES];
                fs::File::open("/dev/urandom")
                    .and_then(|mut random| random.read_exact(&mut bytes))
                    .map_err(SuperviseError::io("reading the OS's random source"))?;
                file.write_all(hex(&bytes).as_bytes())
                    .and_then(|()| file.sync_all())
                    .map_err(SuperviseError::io(format!("writing {}", path.display())))?;
                Ok(Secret(bytes))
            }
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
                let text =
                    fs::read_to_string(&path).map_err(SuperviseError::io(format!("reading {}", path.display())))?;
                from_hex(text.trim())
                    .filter(|bytes| bytes.len() >= SECRET_BYTES)
                    .map(Secret)
                    .ok_or_else(|| {
                        SuperviseError::Token(format!("{} is not a secret this build wrote", path.display()))
                    })
            }
            Err(error) => Err(SuperviseError::Io {
                context: format!("creating {}", path.display()),
                source: error,
            }),
        }
    }

    fn signature(&self, job: OperationId, principal: &str, policy: &str) -> String {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        for part in [job.to_string().as_str(), principal, policy] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        hex(&mac.finalize().into_bytes())
    }

    /// The token of `job` for `principal` under policy revision `policy`.
    pub fn sign(&self, job: OperationId, principal: &str, policy: &str) -> String {
        format!("{PREFIX}.{job}.{}", self.signature(job, principal, policy))
    }

    /// The job a token names, when it verifies for `principal` under
    /// `policy`; refused otherwise (forged, another principal's, an older
    /// policy's, or not a token).
    pub fn verify(&self, token: &str, principal: &str, policy: &str) -> Result<OperationId, SuperviseError> {
        let refused = || {
            SuperviseError::Token(format!(
                "job token {} is not valid here",
                opledger_domain::quoted(token)
            ))
        };
        let (job, signature) = split(token).ok_or_else(refused)?;
        // Compared in constant time: the MAC's own check.
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        for part in [job.to_string().as_str(), principal, policy] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        let presented = from_hex(signature).ok_or_else(refused)?;
        if mac.verify_slice(&presented).is_err() {
            return Err(refused());
        }
        Ok(job)
    }
}

/// The job a token names and its signature, when it has a token's shape
/// (`exp1.<operation>.<hex>`); nothing is verified.
fn split(token: &str) -> Option<(OperationId, &str)> {
    let mut parts = token.split('.');
    let (Some(PREFIX), Some(job), Some(signature), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    Some((job.parse().ok()?, signature))
}

/// Whether `token` has the shape of a job token, signed or not: a service
/// answers text that is no token at all as malformed, and a token that
/// does not verify as refused.
pub fn is_token_shaped(token: &str) -> bool {
    named_job(token).is_some()
}

/// The job a token-shaped text names, verified or not: only for a token
/// that [`Secret::verify`] (or a function that calls it) accepted.
pub fn named_job(token: &str) -> Option<OperationId> {
    split(token)
        .filter(|(_, signature)| from_hex(signature).is_some())
        .map(|(job, _)| job)
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&text[at..at + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> Secret {
        Secret(vec![7; 32])
    }

    #[test]
    fn a_token_verifies_only_for_its_principal_and_policy_revision() {
        let job: OperationId = "01900000-0000-7000-8000-000000000001".parse().unwrap();
        let token = secret().sign(job, "alice", "rev-1");
        assert_eq!(secret().verify(&token, "alice", "rev-1").unwrap(), job);
        assert!(secret().verify(&token, "bob", "rev-1").is_err());
        assert!(secret().verify(&token, "alice", "rev-2").is_err());
        assert!(Secret(vec![8; 32]).verify(&token, "alice", "rev-1").is_err());
        let last = if token.ends_with('0') { "1" } else { "0" };
        let forged = format!("{}{last}", &token[..token.len() - 1]);
        assert!(secret().verify(&forged, "alice", "rev-1").is_err());
        assert!(secret().verify("exp1.not-a-uuid.00", "alice", "rev-1").is_err());
        assert!(is_token_shaped(&token) && is_token_shaped(&forged));
        assert!(!is_token_shaped("exp1.not-a-uuid.00") && !is_token_shaped("opl-claim-none"));
    }
}
