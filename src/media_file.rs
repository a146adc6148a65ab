//! `batch create --media-file F`: media ids one a line, for more items than
//! a command line holds (about 55,000 ids on Linux). The file (or standard
//! input, `-`) is read and every line checked before any store is opened,
//! so a bad line refuses the command with nothing recorded.

use crate::cli::{BatchCommand, Cli, Command};
use crate::UsageError;
use opledger_domain::{quoted, MediaId};
use std::io::Read;
use std::path::Path;

/// The most bytes a media file may hold: a million ids (the most a batch
/// takes) with room for CRLF line ends and indentation.
const MAX_FILE_BYTES: u64 = 64 << 20;

/// Moves the ids of `--media-file` into `--media`'s list, after the ids
/// given there.
pub fn take(cli: &mut Cli) -> Result<(), UsageError> {
    let Command::Batch {
        command: BatchCommand::Create(args),
    } = &mut cli.command
    else {
        return Ok(());
    };
    let Some(path) = args.media_file.take() else {
        return Ok(());
    };
    let name = if path == Path::new("-") {
        "-".to_string()
    } else {
        quoted(&path.to_string_lossy())
    };
    let text = read(&path, &name)?;
    let ids = parse(&text, &name)?;
    if ids.is_empty() && args.media.is_empty() {
        return Err(UsageError(format!(
            "--media-file {name} holds no media id (nothing was recorded)"
        )));
    }
    args.media.extend(ids);
    Ok(())
}

fn read(path: &Path, name: &str) -> Result<String, UsageError> {
    let cannot = |error: std::io::Error| UsageError(format!("--media-file {name}: cannot read it: {error}"));
    let mut bytes = Vec::new();
    if path == Path::new("-") {
        std::io::stdin()
            .take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(cannot)?;
    } else {
        std::fs::File::open(path)
            .map_err(cannot)?
            .take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(cannot)?;
    }
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(UsageError(format!(
            "--media-file {name} is longer than {} MiB, more than a batch's million ids (nothing was recorded)",
            MAX_FILE_BYTES >> 20
        )));
    }
    String::from_utf8(bytes).map_err(|error| {
        let valid = &error.as_bytes()[..error.utf8_error().valid_up_to()];
        let line = valid.iter().filter(|byte| **byte == b'\n').count() + 1;
        UsageError(format!(
            "--media-file {name}, line {line}: not UTF-8 text (nothing was recorded)"
        ))
    })
}

/// The ids of `text`, one a line; blank lines are skipped and spaces
/// around an id ignored. The first line that is not an id refuses all.
fn parse(text: &str, name: &str) -> Result<Vec<MediaId>, UsageError> {
    let mut ids = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let id = line.parse::<MediaId>().map_err(|_| {
            UsageError(format!(
                "--media-file {name}, line {}: {} is not a media id (a UUID); nothing was recorded",
                index + 1,
                quoted(line)
            ))
        })?;
        ids.push(id);
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_media_file_takes_one_id_a_line_and_skips_blank_lines() {
        let text = "00000000-0000-0000-0000-000000000001\r\n\n  \n 00000000-0000-0000-0000-000000000002 \n";
        let ids = parse(text, "-").unwrap();
        assert_eq!(
            ids.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "00000000-0000-0000-0000-000000000001",
                "00000000-0000-0000-0000-000000000002"
            ]
        );
    }

    #[test]
    fn a_bad_line_is_named_by_its_number_and_quoted_short() {
        let long = "x".repeat(100_000);
        let text = format!("00000000-0000-0000-0000-000000000001\n\n{long}\n");
        let error = parse(&text, "\"ids.txt\"").unwrap_err().0;
        assert!(error.starts_with("--media-file \"ids.txt\", line 3: \"xxx"), "{error}");
        assert!(error.contains("(100000 bytes in all)"), "{error}");
        assert!(error.len() < 400, "{error}");
    }
}
