//! Who may do what: roles by bearer token.
//!
//! A tokens file (TOML) holds only SHA-256 hashes of tokens, never the
//! tokens themselves; a presented token is hashed and compared with every
//! entry in constant time, so neither the comparison nor which entry
//! matched leaks through timing. Roles are ordered: a `worker` can do what
//! a `reader` can, an `admin` what both can. A worker token may be limited
//! to listed task kinds.
//!
//! ```toml
//! [[token]]
//! name = "py-1"
//! role = "worker"
//! kinds = ["thumbnail"]
//! sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
//! ```

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;
use std::path::Path;
use subtle::ConstantTimeEq;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Everything that reads.
    Reader,
    /// The work protocol, and reading.
    Worker,
    /// Everything: resolve, cancel, resume, kinds, verify.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Worker => "worker",
            Role::Admin => "admin",
        }
    }

    pub fn parse(text: &str) -> Option<Role> {
        match text {
            "reader" => Some(Role::Reader),
            "worker" => Some(Role::Worker),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One entry of a tokens file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    pub name: String,
    pub role: Role,
    /// The task kinds a worker token may request, claim and report; empty
    /// allows every kind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<String>,
    /// The token's SHA-256, lowercase hex.
    pub sha256: String,
}

impl TokenEntry {
    /// The access-policy revision of this principal: the SHA-256 of its
    /// entry as a tokens file writes it (name, role, kinds and the token's
    /// hash). Export job tokens are bound to it, so rotating the principal's
    /// token or changing its role or kinds refuses every job token it held,
    /// while other principals' entries leave it as it is.
    pub fn policy_revision(&self) -> String {
        to_hex(&sha256(&entry_toml(self)))
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    token: Vec<TokenEntry>,
}

/// The tokens a service accepts.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    entries: Vec<(TokenEntry, [u8; 32])>,
}

/// A tokens file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("tokens file {path}: {reason}")]
pub struct TokensError {
    pub path: String,
    pub reason: String,
}

/// The longest tokens file read (a file of a few thousand entries).
const MAX_TOKENS_FILE_BYTES: u64 = 1 << 20;

impl Tokens {
    /// No tokens: only anonymous access, if allowed.
    pub fn none() -> Self {
        Tokens::default()
    }

    /// Reads and checks a tokens file.
    pub fn load(path: &Path) -> Result<Self, TokensError> {
        let refuse = |reason: String| TokensError {
            path: path.display().to_string(),
            reason,
        };
        let size = std::fs::metadata(path)
            .map_err(|error| refuse(error.to_string()))?
            .len();
        if size > MAX_TOKENS_FILE_BYTES {
            return Err(refuse(format!(
                "{size} bytes is over the limit of {MAX_TOKENS_FILE_BYTES}"
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|error| refuse(error.to_string()))?;
        Tokens::parse(&text).map_err(refuse)
    }

    /// Parses a tokens file's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: TokensFile = toml::from_str(text).map_err(|error| {
            let message = error.message().to_string();
            opledger_domain::quote(&message)
        })?;
        let mut entries = Vec::with_capacity(file.token.len());
        for entry in file.token {
            let hash = parse_hash(&entry.sha256).ok_or_else(|| {
                format!(
                    "token {} has no valid sha256 (64 hex digits)",
                    opledger_domain::quoted(&entry.name)
                )
            })?;
            if entry.name.trim().is_empty() {
                return Err("a token has an empty name".to_string());
            }
            if entries
                .iter()
                .any(|(known, _): &(TokenEntry, [u8; 32])| known.name == entry.name)
            {
                return Err(format!(
                    "token name {} appears twice",
                    opledger_domain::quoted(&entry.name)
                ));
            }
            entries.push((entry, hash));
        }
        Ok(Tokens { entries })
    }

    /// Whether an entry has this name.
    pub fn has_name(&self, name: &str) -> bool {
        self.entries.iter().any(|(entry, _)| entry.name == name)
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry a presented token matches. Every entry is compared, in
    /// constant time each, whichever matches.
    pub fn find(&self, token: &str) -> Option<&TokenEntry> {
        let presented = sha256(token);
        let mut found = None;
        for (entry, hash) in &self.entries {
            if bool::from(hash.ct_eq(&presented)) {
                found = Some(entry);
            }
        }
        found
    }
}

fn sha256(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

fn parse_hash(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        return None;
    }
    let mut hash = [0u8; 32];
    for (index, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[index * 2..index * 2 + 2], 16).ok()?;
    }
    Some(hash)
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A new token (`opl_` and 32 random bytes in hex) and the entry that
/// accepts it.
pub fn new_token(name: &str, role: Role, kinds: Vec<String>) -> Result<(String, TokenEntry), getrandom::Error> {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret)?;
    let token = format!("opl_{}", to_hex(&secret));
    let entry = TokenEntry {
        name: name.to_string(),
        role,
        kinds,
        sha256: to_hex(&sha256(&token)),
    };
    Ok((token, entry))
}

/// The lines of a tokens file that hold `entry`.
pub fn entry_toml(entry: &TokenEntry) -> String {
    #[derive(Serialize)]
    struct One<'a> {
        token: [&'a TokenEntry; 1],
    }
    toml::to_string(&One { token: [entry] }).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_token_is_found_by_its_entry_and_no_other_text_is() {
        let (token, entry) = new_token("py-1", Role::Worker, vec!["thumbnail".into()]).unwrap();
        let tokens = Tokens::parse(&entry_toml(&entry)).unwrap();
        assert_eq!(tokens.find(&token).map(|found| found.name.as_str()), Some("py-1"));
        assert!(tokens.find(&token[..token.len() - 1]).is_none());
        assert!(tokens.find("").is_none());
        assert!(!entry_toml(&entry).contains(&token), "the file holds only the hash");
    }

    #[test]
    fn a_tokens_file_with_a_bad_hash_or_a_repeated_name_is_refused() {
        assert!(Tokens::parse("[[token]]\nname='a'\nrole='admin'\nsha256='xyz'\n").is_err());
        let (_, entry) = new_token("a", Role::Admin, vec![]).unwrap();
        let twice = format!("{}\n{}", entry_toml(&entry), entry_toml(&entry));
        assert!(Tokens::parse(&twice).unwrap_err().contains("twice"));
        assert!(Tokens::parse("[[token]]\nname='a'\nrole='root'\nsha256='00'\n").is_err());
    }

    #[test]
    fn a_policy_revision_changes_with_its_own_entry_only() {
        let (_, entry) = new_token("alice", Role::Reader, vec![]).unwrap();
        let (_, rotated) = new_token("alice", Role::Reader, vec![]).unwrap();
        let promoted = TokenEntry {
            role: Role::Admin,
            ..entry.clone()
        };
        assert_eq!(entry.policy_revision(), entry.clone().policy_revision());
        assert_ne!(entry.policy_revision(), rotated.policy_revision());
        assert_ne!(entry.policy_revision(), promoted.policy_revision());
    }

    #[test]
    fn roles_are_ordered_reader_worker_admin() {
        assert!(Role::Reader < Role::Worker && Role::Worker < Role::Admin);
    }
}
