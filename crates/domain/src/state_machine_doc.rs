//! Renders `docs/state-machines.md` from the transition table, so the
//! document cannot drift from the code: a test regenerates it and fails when
//! the committed file differs.

use crate::status::{CapabilityStatus, IngestionStage, OperationStatus};
use crate::transitions::{INITIAL_STATUSES, TABLE};
use std::fmt::Write;

/// The full text of `docs/state-machines.md`.
pub fn render() -> String {
    let mut doc = String::new();
    doc.push_str("# State machines\n\n");
    doc.push_str(
        "<!-- Generated from crates/domain/src/transitions.rs by `cargo run -- docs state-machines`. \
         Do not edit by hand: the test `state_machine_doc_is_current` fails when this file is out of date. -->\n\n",
    );
    doc.push_str("## Operation status\n\n");
    doc.push_str(
        "Every status change of an operation goes through this table. A move it lacks is refused \
         with an error naming from, to and cause, and nothing is appended.\n\n",
    );
    doc.push_str("```mermaid\nstateDiagram-v2\n");
    for status in INITIAL_STATUSES {
        let _ = writeln!(doc, "    [*] --> {}", status.as_str());
    }
    for rule in TABLE {
        for from in rule.from {
            let _ = writeln!(
                doc,
                "    {} --> {}: {}",
                from.as_str(),
                rule.destination.as_str(),
                rule.cause.as_str()
            );
        }
    }
    doc.push_str("```\n\n");
    doc.push_str("| cause | to | from |\n| --- | --- | --- |\n");
    for rule in TABLE {
        let from: Vec<&str> = rule.from.iter().map(|status| status.as_str()).collect();
        let _ = writeln!(
            doc,
            "| `{}` | `{}` | {} |",
            rule.cause.as_str(),
            rule.destination.as_str(),
            from.iter()
                .map(|name| format!("`{name}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let terminal: Vec<String> = OperationStatus::ALL
        .iter()
        .filter(|status| status.is_terminal())
        .map(|status| format!("`{status}`"))
        .collect();
    let _ = writeln!(
        doc,
        "\nTerminal statuses (left only by `reopen`, a recorded action): {}.\n",
        terminal.join(", ")
    );
    doc.push_str("## Ingestion stages\n\n");
    doc.push_str(
        "An `ingestion.file` operation also carries a stage. Stages only move forward; a file may skip \
         stages that do not apply to it.\n\n```mermaid\nflowchart LR\n",
    );
    for pair in IngestionStage::ALL.windows(2) {
        let _ = writeln!(doc, "    {} --> {}", pair[0].as_str(), pair[1].as_str());
    }
    doc.push_str("```\n\n## Capability status\n\n");
    let capabilities: Vec<String> = CapabilityStatus::ALL
        .iter()
        .map(|status| format!("`{status}`"))
        .collect();
    let _ = writeln!(doc, "The capability vocabulary: {}.", capabilities.join(", "));
    doc
}
