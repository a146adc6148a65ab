//! Bounds on the text a command records from its flags (`--error`,
//! `--reason`, `--output`, `--no-result`), checked before any store is
//! opened, so a refused command records nothing. The bound is
//! `--max-text-bytes` (or `OPLEDGER_MAX_TEXT_BYTES`), 64 KiB by default:
//! every recorded text is an event in the log forever, and is shown by
//! `timeline`, `task show` and the review queue.

use crate::cli::{BatchCommand, Cli, Command, ReviewCommand, TaskCommand};
use crate::UsageError;
use std::io::Read;

/// Refuses a text flag longer than the bound, naming the flag, its length
/// and how to raise the bound. `--output -` is read from standard input
/// here (at most one byte past the bound), so the bound covers it too.
pub fn check(cli: &mut Cli) -> Result<(), UsageError> {
    let bound = cli.max_text_bytes;
    let mut texts: Vec<(&'static str, &str)> = Vec::new();
    match &mut cli.command {
        Command::Task { command } => match command {
            TaskCommand::Fail(args) => texts.push(("--error", &args.error)),
            TaskCommand::Cancel(args) => texts.extend(args.reason.as_deref().map(|reason| ("--reason", reason))),
            TaskCommand::Release(args) => texts.extend(args.reason.as_deref().map(|reason| ("--reason", reason))),
            TaskCommand::Complete(args) => {
                if args.output.as_deref() == Some("-") {
                    args.output = Some(read_stdin("--output", bound)?);
                }
                texts.extend(args.output.as_deref().map(|output| ("--output", output)));
                texts.extend(args.no_result.as_deref().map(|reason| ("--no-result", reason)));
            }
            _ => {}
        },
        Command::Batch {
            command: BatchCommand::Cancel { reason, .. } | BatchCommand::Resume { reason, .. },
        } => texts.push(("--reason", reason)),
        Command::Review {
            command: ReviewCommand::Resolve(args),
        } => texts.push(("--reason", &args.reason)),
        _ => {}
    }
    for (flag, text) in texts {
        if text.len() > bound {
            return Err(too_long(flag, &format!("{} bytes", text.len()), bound));
        }
        // A JSON `--output` may spell one as \u0000: refused as the
        // service refuses it.
        let in_json = flag.starts_with("--output")
            && serde_json::from_str::<serde_json::Value>(text).is_ok_and(|value| holds_nul(&value));
        if text.contains('\0') || in_json {
            return Err(UsageError(format!(
                "{flag} holds a NUL character (nothing was recorded)"
            )));
        }
    }
    Ok(())
}

/// Whether a key or string anywhere in `value` holds a NUL character.
fn holds_nul(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::String(text) => text.contains('\0'),
        serde_json::Value::Array(items) => items.iter().any(holds_nul),
        serde_json::Value::Object(fields) => fields.iter().any(|(key, field)| key.contains('\0') || holds_nul(field)),
        _ => false,
    }
}

fn too_long(flag: &str, length: &str, bound: usize) -> UsageError {
    UsageError(format!(
        "{flag} is {length}, more than the {bound} a text flag may take (nothing was recorded; \
         raise the bound with --max-text-bytes or OPLEDGER_MAX_TEXT_BYTES)"
    ))
}

/// Standard input as text, refused past `bound` bytes.
fn read_stdin(flag: &str, bound: usize) -> Result<String, UsageError> {
    let mut buffer = Vec::new();
    std::io::stdin()
        .take(bound as u64 + 1)
        .read_to_end(&mut buffer)
        .map_err(|error| UsageError(format!("{flag} -: cannot read standard input: {error}")))?;
    if buffer.len() > bound {
        return Err(too_long(&format!("{flag} -"), "longer", bound));
    }
    String::from_utf8(buffer).map_err(|_| UsageError(format!("{flag} -: standard input is not UTF-8 text")))
}
