//! `opledger kinds`: apply a declaration file, list and show the declared
//! task kinds. The rules and the file format are the engine's
//! (`Engine::apply_kinds`, `parse_kinds`); this prints.

use crate::cli::{KindsCommand, ReprocessArgs};
use crate::output::print_json;
use anyhow::Context;
use opledger_domain::kinds::KindDeclaration;
use opledger_domain::projections::TaskKindRow;
use opledger_engine::{parse_kinds, CommandContext, Engine, EngineError, KindStatus, MAX_KINDS_FILE_BYTES};
use opledger_store::Store;
use serde_json::{json, Value};
use std::io::Read;
use std::path::Path;

pub async fn run<S: Store>(engine: &Engine<S>, command: &KindsCommand, as_json: bool) -> anyhow::Result<()> {
    match command {
        KindsCommand::Apply { file, dry_run } => apply(engine, file, *dry_run, as_json).await,
        KindsCommand::List => list(engine, as_json).await,
        KindsCommand::Show { name } => show(engine, name, as_json).await,
    }
}

/// `opledger reprocess --stale`: one batch over every stale result.
pub async fn reprocess<S: Store>(engine: &Engine<S>, args: &ReprocessArgs, as_json: bool) -> anyhow::Result<()> {
    let outcome = engine
        .reprocess_stale(
            &CommandContext::actor("cli"),
            args.kind.as_deref(),
            args.batch_name.clone(),
        )
        .await?;
    if as_json {
        print_json(&json!({
            "batch_id": outcome.batch_id.map(|id| id.to_string()),
            "requested": outcome.requested,
        }));
    } else {
        match outcome.batch_id {
            Some(batch_id) => println!(
                "requested {} stale result(s) again at the current version: batch {batch_id}",
                outcome.requested
            ),
            None => println!("nothing is stale"),
        }
    }
    Ok(())
}

/// Reads at most [`MAX_KINDS_FILE_BYTES`] (and one more, to tell a file
/// that is too long) of `path`, `-` being standard input.
fn read_file(path: &Path) -> anyhow::Result<String> {
    let mut bytes = Vec::new();
    let limit = MAX_KINDS_FILE_BYTES as u64 + 1;
    if path == Path::new("-") {
        std::io::stdin().take(limit).read_to_end(&mut bytes)?;
    } else {
        std::fs::File::open(path)
            .and_then(|file| file.take(limit).read_to_end(&mut bytes))
            .map_err(|error| {
                EngineError::invalid(format!(
                    "cannot read {}: {error}",
                    opledger_domain::quote(&path.to_string_lossy())
                ))
            })?;
    }
    String::from_utf8(bytes).map_err(|_| {
        EngineError::invalid(format!(
            "{} is not UTF-8 text",
            opledger_domain::quote(&path.to_string_lossy())
        ))
        .into()
    })
}

async fn apply<S: Store>(engine: &Engine<S>, file: &Path, dry_run: bool, as_json: bool) -> anyhow::Result<()> {
    let text = read_file(file)?;
    let document = parse_kinds(&text).with_context(|| opledger_domain::quote(&file.to_string_lossy()))?;
    let report = engine
        .apply_kinds(&CommandContext::actor("cli"), &document, dry_run)
        .await?;
    if as_json {
        print_json(&serde_json::to_value(&report)?);
    } else {
        for kind in &report.kinds {
            let status = match kind.status {
                KindStatus::Declared => "declared",
                KindStatus::Unchanged => "unchanged",
                KindStatus::Changed => "changed",
                KindStatus::Refused => "refused",
            };
            let detail = match (&kind.error, kind.stale_items, kind.retargeted) {
                (Some(error), _, _) => format!("  {error}"),
                (None, 0, 0) => String::new(),
                (None, stale, 0) => format!("  ({stale} result(s) now stale)"),
                (None, stale, moved) => format!(
                    "  ({stale} result(s) now stale; {moved} waiting task(s) moved to version {})",
                    kind.version
                ),
            };
            println!("{:<20} {:<10} version {}{detail}", kind.name, status, kind.version);
        }
        if dry_run && report.refused().next().is_none() {
            println!("dry run: nothing was recorded");
        }
    }
    let refused = report.refused().count();
    if refused > 0 {
        return Err(EngineError::invalid(format!(
            "{}: {refused} task kind(s) refused; nothing was recorded",
            file.display()
        ))
        .into());
    }
    Ok(())
}

fn kind_json(row: &TaskKindRow) -> Value {
    let mut value = match &row.declaration {
        Some(declaration) => serde_json::to_value(declaration).expect("a declaration serializes"),
        None => json!({
            "name": row.name,
            "target": row.target,
            "version": row.kind_version,
            "capability": row.capability,
            "required": row.required,
        }),
    };
    if let Value::Object(object) = &mut value {
        object.insert("declared".into(), json!(row.declared));
        object.insert("declared_at".into(), json!(row.declared_at.to_rfc3339()));
        object.insert("updated_at".into(), json!(row.updated_at.to_rfc3339()));
    }
    value
}

async fn list<S: Store>(engine: &Engine<S>, as_json: bool) -> anyhow::Result<()> {
    let kinds = engine.task_kinds().await?;
    if as_json {
        print_json(&json!({ "kinds": kinds.iter().map(kind_json).collect::<Vec<_>>() }));
        return Ok(());
    }
    if kinds.is_empty() {
        println!("no task kinds declared (declare them with `opledger kinds apply FILE`)");
    }
    for row in &kinds {
        let Some(declaration) = &row.declaration else {
            println!(
                "{:<20} {:<6} version {:<8} (seen in tasks, not declared)",
                row.name, row.target, row.kind_version
            );
            continue;
        };
        println!(
            "{:<20} {:<6} version {:<8} {:<9} produces {}{}{}",
            row.name,
            row.target,
            declaration.version,
            if declaration.required { "required" } else { "optional" },
            declaration.capability().unwrap_or("-"),
            list_suffix("applies to", &declaration.applies_to),
            list_suffix("needs", &declaration.needs),
        );
    }
    Ok(())
}

fn list_suffix(what: &str, items: &[String]) -> String {
    if items.is_empty() {
        String::new()
    } else {
        format!(", {what} {}", items.join(", "))
    }
}

async fn show<S: Store>(engine: &Engine<S>, name: &str, as_json: bool) -> anyhow::Result<()> {
    let row = engine.task_kind(name).await?;
    if as_json {
        print_json(&kind_json(&row));
        return Ok(());
    }
    let Some(declaration) = &row.declaration else {
        unreachable!("task_kind answers declared kinds only")
    };
    print_declaration(declaration);
    println!("declared at {}, last changed {}", row.declared_at, row.updated_at);
    Ok(())
}

fn print_declaration(kind: &KindDeclaration) {
    println!("{} ({} target), version {}", kind.name, kind.target, kind.version);
    if let Some(purpose) = &kind.purpose {
        println!("  {purpose}");
    }
    println!(
        "  produces: {} ({})",
        kind.capability().unwrap_or("no capability"),
        if kind.required { "required" } else { "optional" }
    );
    println!(
        "  applies to: {}",
        if kind.applies_to.is_empty() {
            "every media kind".to_string()
        } else {
            kind.applies_to.join(", ")
        }
    );
    println!(
        "  needs: {}",
        if kind.needs.is_empty() {
            "nothing".to_string()
        } else {
            kind.needs.join(", ")
        }
    );
    println!("  inputs:");
    for (name, input) in &kind.inputs {
        let mut rules = vec![format!("{:?}", input.kind).to_lowercase()];
        if input.required {
            rules.push("required".into());
        }
        if input.from_target {
            rules.push("from the target".into());
        }
        if let Some(default) = &input.default {
            rules.push(format!("default {default}"));
        }
        if let Some(min) = input.min {
            rules.push(format!("min {min}"));
        }
        if let Some(max) = input.max {
            rules.push(format!("max {max}"));
        }
        if let Some(values) = &input.one_of {
            rules.push(format!("one of {}", values.join(", ")));
        }
        println!("    {name}: {}", rules.join(", "));
    }
    let retry = &kind.retry;
    println!(
        "  retry: {} attempts, backoff {} ms doubling to {} ms, jitter {}, then {}; {} interruptions, {}",
        retry.max_attempts,
        retry.base_backoff_ms,
        retry.max_backoff_ms,
        retry.jitter_per_mille as f64 / 1_000.0,
        match retry.exhausted {
            opledger_domain::tasks::Exhausted::FailTerminal => "failed_terminal",
            opledger_domain::tasks::Exhausted::DeadLetter => "dead_lettered",
        },
        retry.max_interruptions,
        if retry.requeue_after_interruption {
            "requeued after an interruption"
        } else {
            "not re-run after an interruption"
        }
    );
}
