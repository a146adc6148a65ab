//! Writing an export's records as CSV or JSON, counting what is really
//! written: after every data row (CSV; subtotal and total rows included,
//! the header not) or pivot cell (JSON), `after_record` hears the count so
//! far. The file is hashed as it is written and fsynced at the end.

use super::records::Records;
use super::{ExportSpec, Format};
use opledger_store::StoreError;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{BufWriter, Write};

/// A complete, fsynced file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub size: u64,
    pub sha256: String,
    pub processed: u64,
}

/// Why writing stopped.
#[derive(Debug)]
pub enum WriteStop {
    Io(std::io::Error),
    /// A folded row could not be read back.
    Store(StoreError),
    /// `after_record` said stop.
    Stopped,
}

impl From<StoreError> for WriteStop {
    fn from(error: StoreError) -> Self {
        WriteStop::Store(error)
    }
}

impl From<std::io::Error> for WriteStop {
    fn from(error: std::io::Error) -> Self {
        WriteStop::Io(error)
    }
}

struct Hashing<W: Write> {
    inner: W,
    hasher: Sha256,
    bytes: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.hasher.update(&buf[..written]);
        self.bytes += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes `records` into `file` in `spec`'s format.
pub fn write_records(
    spec: &ExportSpec,
    records: &Records,
    file: File,
    mut after_record: impl FnMut(u64) -> Result<(), ()>,
) -> Result<Written, WriteStop> {
    let mut out = Hashing {
        inner: BufWriter::with_capacity(64 * 1024, file),
        hasher: Sha256::new(),
        bytes: 0,
    };
    let mut processed = 0u64;
    let mut counted = || -> Result<(), WriteStop> {
        processed += 1;
        after_record(processed).map_err(|()| WriteStop::Stopped)
    };
    match (records, spec.format) {
        (Records::Rows { columns, rows }, Format::Csv) => {
            writeln!(out, "{}", columns.join(","))?;
            rows.each(|row| {
                let cells: Vec<String> = row.iter().map(csv_cell).collect();
                writeln!(out, "{}", cells.join(","))?;
                counted()
            })?;
        }
        (Records::Rows { columns, rows }, Format::Json) => {
            write!(
                out,
                "{{\"as_of_seq\":{},\"what\":\"{}\",\"rows\":[",
                spec.as_of_seq, spec.what
            )?;
            let mut first = true;
            rows.each(|row| {
                let separator = if first { "" } else { "," };
                first = false;
                let fields: Vec<String> = columns
                    .iter()
                    .zip(row)
                    .map(|(column, value)| format!("\"{column}\":{}", json(value)))
                    .collect();
                write!(out, "{separator}\n{{{}}}", fields.join(","))?;
                counted()
            })?;
            writeln!(out, "\n]}}")?;
        }
        (Records::Pivot(pivot), Format::Csv) => {
            writeln!(out, "row_type,capability,status,count")?;
            let mut total = 0u64;
            for (capability, statuses) in pivot {
                let mut subtotal = 0u64;
                for (status, count) in statuses {
                    writeln!(out, "cell,{},{},{count}", csv_text(capability), csv_text(status))?;
                    counted()?;
                    subtotal += count;
                }
                writeln!(out, "subtotal,{},,{subtotal}", csv_text(capability))?;
                counted()?;
                total += subtotal;
            }
            writeln!(out, "total,,,{total}")?;
            counted()?;
        }
        (Records::Pivot(pivot), Format::Json) => {
            write!(
                out,
                "{{\"as_of_seq\":{},\"what\":\"{}\",\"pivot\":{{",
                spec.as_of_seq, spec.what
            )?;
            let mut total = 0u64;
            for (index, (capability, statuses)) in pivot.iter().enumerate() {
                let separator = if index == 0 { "" } else { "," };
                write!(out, "{separator}\n{}:{{", json(&Value::from(capability.as_str())))?;
                let mut subtotal = 0u64;
                for (status, count) in statuses {
                    write!(out, "{}:{count},", json(&Value::from(status.as_str())))?;
                    counted()?;
                    subtotal += count;
                }
                write!(out, "\"subtotal\":{subtotal}}}")?;
                counted()?;
                total += subtotal;
            }
            writeln!(out, "\n}},\"total\":{total}}}")?;
            counted()?;
        }
    }
    out.flush()?;
    let Hashing { inner, hasher, bytes } = out;
    let file = inner.into_inner().map_err(|error| error.into_error())?;
    file.sync_all()?;
    Ok(Written {
        size: bytes,
        sha256: format!("{:x}", hasher.finalize()),
        processed,
    })
}

fn json(value: &Value) -> String {
    serde_json::to_string(value).expect("a JSON value serializes")
}

fn csv_cell(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(text) => csv_text(text),
        other => other.to_string(),
    }
}

/// A CSV field (RFC 4180): quoted when it holds a comma, a quote or a line
/// break, its quotes doubled.
fn csv_text(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_csv_field_with_a_comma_quote_or_line_break_is_quoted() {
        assert_eq!(csv_text("plain"), "plain");
        assert_eq!(csv_text("a,b"), "\"a,b\"");
        assert_eq!(csv_text("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_text("two\nlines"), "\"two\nlines\"");
    }
}
