//! Generated references: `opledger docs cli` renders the command line's
//! clap tree as Markdown (`docs/cli.md`), `opledger docs http` renders the
//! service's OpenAPI document (`docs/http.md`), and `opledger docs
//! state-machines` renders the domain's transition table, ingestion stages
//! and capability vocabulary (`docs/state-machines.md`). Each is committed
//! and checked current by a test in `tests/it/cli.rs`; what the references
//! say comes from the definitions alone, so they cannot disagree with the
//! binary.

use clap::{Arg, Command, CommandFactory};
use opledger_domain::status::{CapabilityStatus, IngestionStage, OperationStatus};
use opledger_domain::transitions::{INITIAL_STATUSES, TABLE};
use serde_json::{Map, Value};
use std::fmt::Write;

/// The full text of `docs/cli.md`.
pub fn cli_reference() -> String {
    let mut root = crate::cli::Cli::command();
    root.build();
    let mut out = String::from(
        "# Command-line reference\n\n\
         Generated from the command line's definition (`src/cli.rs`, `src/supervise.rs`) by\n\
         `opledger docs cli`; `tests/it/cli.rs` fails when this file is not what it prints.\n\
         Regenerate it with:\n\n\
         ```sh\ncargo run -q -- docs cli > docs/cli.md\n```\n\n\
         How the commands fit together is in [using.md](using.md); exit codes are listed there too.\n\n",
    );
    let about = root.get_about().map(ToString::to_string).unwrap_or_default();
    let _ = writeln!(out, "{about}\n\n```text\n{}\n```\n", usage(&mut root));
    out.push_str("## Global options\n\nAccepted by every command.\n\n");
    for arg in root.get_arguments().filter(|arg| arg.is_global_set()) {
        out.push_str(&argument(arg));
    }
    out.push_str("\n## Commands\n\n");
    let mut commands = Vec::new();
    collect(&root, "opledger", &mut commands);
    for (path, command) in &commands {
        let about = command.get_about().map(ToString::to_string).unwrap_or_default();
        let _ = writeln!(out, "- [`{path}`](#{}): {}", anchor(path), one_line(&about));
    }
    for (path, command) in commands {
        blank_line(&mut out);
        out.push_str(&command_section(&path, command));
    }
    blank_line(&mut out);
    out.pop();
    out
}

/// Ends `out` with exactly one blank line.
fn blank_line(out: &mut String) {
    while out.ends_with('\n') {
        out.pop();
    }
    out.push_str("\n\n");
}

/// Every visible command below `command`, depth first, with its full name.
fn collect<'a>(command: &'a Command, path: &str, into: &mut Vec<(String, &'a Command)>) {
    for sub in visible(command) {
        let name = format!("{path} {}", sub.get_name());
        into.push((name.clone(), sub));
        collect(sub, &name, into);
    }
}

/// The subcommands a reader runs: not hidden, and not clap's `help`.
fn visible(command: &Command) -> impl Iterator<Item = &Command> {
    command
        .get_subcommands()
        .filter(|sub| !sub.is_hide_set() && sub.get_name() != "help")
}

/// One command's section: its help, usage, arguments and options.
fn command_section(path: &str, command: &Command) -> String {
    let mut out = format!("## {path}\n\n");
    let about = command.get_long_about().or(command.get_about());
    if let Some(about) = about {
        let _ = writeln!(out, "{}\n", about.to_string().trim_end());
    }
    let _ = writeln!(out, "```text\n{}\n```\n", usage(&mut command.clone()));
    let subcommands: Vec<&Command> = visible(command).collect();
    if !subcommands.is_empty() {
        out.push_str("Subcommands:\n\n");
        for sub in subcommands {
            let name = format!("{path} {}", sub.get_name());
            let _ = writeln!(out, "- [`{}`](#{})", sub.get_name(), anchor(&name));
        }
        out.push('\n');
    }
    let own = |arg: &&Arg| !arg.is_global_set() && !arg.is_hide_set() && !is_builtin(arg);
    let positionals: Vec<&Arg> = command.get_positionals().filter(own).collect();
    let options: Vec<&Arg> = command
        .get_arguments()
        .filter(|arg| !arg.is_positional())
        .filter(own)
        .collect();
    for (title, args) in [("Arguments", positionals), ("Options", options)] {
        if args.is_empty() {
            continue;
        }
        let _ = writeln!(out, "{title}:\n");
        for arg in args {
            out.push_str(&argument(arg));
        }
        out.push('\n');
    }
    out
}

/// `--help` and `--version`, which every command has.
fn is_builtin(arg: &Arg) -> bool {
    matches!(arg.get_id().as_str(), "help" | "version")
}

/// A command's usage line, without clap's `Usage: ` prefix.
fn usage(command: &mut Command) -> String {
    let text = command.render_usage().to_string();
    text.trim().trim_start_matches("Usage:").trim().to_string()
}

/// One argument as a list item: its spelling, its help, then what clap
/// knows of its values (required, default, choices, environment).
fn argument(arg: &Arg) -> String {
    let mut facts = Vec::new();
    if arg.is_required_set() {
        facts.push("required".to_string());
    }
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|value| value.to_string_lossy().into_owned())
        .collect();
    if !defaults.is_empty() && !arg.is_hide_default_value_set() && arg.get_action().takes_values() {
        facts.push(format!("default `{}`", defaults.join(",")));
    }
    let choices: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|value| !value.is_hide_set())
        .map(|value| format!("`{}`", value.get_name()))
        .collect();
    if !choices.is_empty() && arg.get_action().takes_values() {
        facts.push(format!("one of {}", choices.join(", ")));
    }
    if let Some(env) = arg.get_env() {
        facts.push(format!("env `{}`", env.to_string_lossy()));
    }
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(ToString::to_string)
        .unwrap_or_default();
    let mut line = format!("- `{}`", spelling(arg));
    if !help.is_empty() {
        let _ = write!(line, ": {}", indent(help.trim_end()));
    }
    if !facts.is_empty() {
        let _ = write!(line, " ({})", facts.join("; "));
    }
    line.push('\n');
    line
}

/// How an argument is written: `<DIR>`, `--lease <SECONDS>`, `-n, --count <N>`.
fn spelling(arg: &Arg) -> String {
    let value = arg
        .get_value_names()
        .and_then(|names| names.first())
        .map(|name| name.to_string())
        .unwrap_or_else(|| arg.get_id().as_str().to_uppercase());
    let repeated = matches!(arg.get_action(), clap::ArgAction::Append);
    let dots = if repeated { "..." } else { "" };
    if arg.is_positional() {
        return format!("<{value}>{dots}");
    }
    let mut names = Vec::new();
    if let Some(short) = arg.get_short() {
        names.push(format!("-{short}"));
    }
    if let Some(long) = arg.get_long() {
        names.push(format!("--{long}"));
    }
    let mut text = names.join(", ");
    if arg.get_action().takes_values() {
        let _ = write!(text, " <{value}>{dots}");
    }
    text
}

/// Continuation lines of a list item, indented under it.
fn indent(text: &str) -> String {
    let lines: Vec<String> = text
        .lines()
        .enumerate()
        .map(|(number, line)| match (number, line.is_empty()) {
            (0, _) | (_, true) => line.to_string(),
            _ => format!("  {line}"),
        })
        .collect();
    lines.join("\n")
}

/// A heading's anchor as GitHub makes it: lower case, spaces to dashes,
/// punctuation other than `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Text on one line (for a list or a table cell).
fn one_line(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// The full text of `docs/http.md`.
pub fn http_reference() -> String {
    let document = serde_json::to_value(opledger_http::openapi()).expect("the OpenAPI document serializes");
    let mut out = String::from(
        "# HTTP reference\n\n\
         Generated from the service's OpenAPI document (`opledger_http::openapi()`, served at\n\
         `/openapi.json` and committed as [openapi.json](openapi.json)) by `opledger docs http`;\n\
         `tests/it/cli.rs` fails when this file is not what it prints. Regenerate it with:\n\n\
         ```sh\ncargo run -q -- docs http > docs/http.md\n```\n\n\
         What the service is, the role each route needs and what each error status means are in\n\
         [http-service.md](http-service.md). A route whose authentication is *bearer* takes\n\
         `Authorization: Bearer TOKEN`; every error answer is an [ErrorBody](#errorbody).\n\n",
    );
    let routes = routes(&document);
    out.push_str("| method | path | tag | summary |\n| --- | --- | --- | --- |\n");
    for (method, path, operation) in &routes {
        let heading = format!("{} {path}", method.to_uppercase());
        let _ = writeln!(
            out,
            "| {} | [`{path}`](#{}) | {} | {} |",
            method.to_uppercase(),
            anchor(&heading),
            tags(operation),
            first_line(operation)
        );
    }
    for (method, path, operation) in &routes {
        blank_line(&mut out);
        out.push_str(&route_section(method, path, operation));
    }
    blank_line(&mut out);
    out.push_str("## Schemas\n");
    if let Some(schemas) = document.pointer("/components/schemas").and_then(Value::as_object) {
        for (name, schema) in schemas {
            blank_line(&mut out);
            out.push_str(&schema_section(name, schema));
        }
    }
    blank_line(&mut out);
    out.pop();
    out
}

/// Every route of the document as (method, path, operation), by path.
fn routes(document: &Value) -> Vec<(String, String, &Map<String, Value>)> {
    let mut routes = Vec::new();
    let Some(paths) = document.get("paths").and_then(Value::as_object) else {
        return routes;
    };
    for (path, item) in paths {
        for method in ["get", "put", "post", "delete", "head", "patch"] {
            if let Some(operation) = item.get(method).and_then(Value::as_object) {
                routes.push((method.to_string(), path.clone(), operation));
            }
        }
    }
    routes
}

fn tags(operation: &Map<String, Value>) -> String {
    let tags: Vec<&str> = operation
        .get("tags")
        .and_then(Value::as_array)
        .map(|tags| tags.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    tags.join(", ")
}

/// The first sentence-line of a route's summary, for the index table.
fn first_line(operation: &Map<String, Value>) -> String {
    let summary = operation.get("summary").and_then(Value::as_str).unwrap_or("");
    let paragraph = summary.split("\n\n").next().unwrap_or("");
    one_line(paragraph)
}

/// One route: summary, tag, authentication, parameters, body, responses.
fn route_section(method: &str, path: &str, operation: &Map<String, Value>) -> String {
    let mut out = format!("## {} {path}\n\n", method.to_uppercase());
    for key in ["summary", "description"] {
        if let Some(text) = operation
            .get(key)
            .and_then(Value::as_str)
            .filter(|text| !text.is_empty())
        {
            let _ = writeln!(out, "{}\n", text.trim_end());
        }
    }
    let secured = operation
        .get("security")
        .is_some_and(|security| security != &Value::Array(Vec::new()));
    let auth = if secured { "bearer" } else { "none" };
    let _ = writeln!(out, "Tag: {}. Authentication: {auth}.\n", tags(operation));
    if let Some(parameters) = operation.get("parameters").and_then(Value::as_array) {
        out.push_str("| parameter | in | required | type | description |\n| --- | --- | --- | --- | --- |\n");
        for parameter in parameters {
            let text = |key: &str| parameter.get(key).and_then(Value::as_str).unwrap_or("").to_string();
            let required = parameter.get("required").and_then(Value::as_bool).unwrap_or(false);
            let schema = parameter.get("schema").cloned().unwrap_or(Value::Null);
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} | {} |",
                text("name"),
                text("in"),
                if required { "yes" } else { "no" },
                type_name(&schema),
                one_line(&text("description"))
            );
        }
        out.push('\n');
    }
    if let Some(body) = operation.get("requestBody") {
        let required = body.get("required").and_then(Value::as_bool).unwrap_or(false);
        let optional = if required { "" } else { " (optional)" };
        let _ = writeln!(out, "Request body{optional}: {}\n", content(body));
    }
    out.push_str("| status | body | description |\n| --- | --- | --- |\n");
    if let Some(responses) = operation.get("responses").and_then(Value::as_object) {
        for (status, response) in responses {
            let description = response.get("description").and_then(Value::as_str).unwrap_or("");
            let _ = writeln!(out, "| {status} | {} | {} |", content(response), one_line(description));
        }
    }
    out
}

/// A body's content types with their schemas: `application/json` `Name`.
fn content(body: &Value) -> String {
    let Some(content) = body.get("content").and_then(Value::as_object) else {
        return "none".to_string();
    };
    let parts: Vec<String> = content
        .iter()
        .map(|(media_type, media)| {
            let schema = media.get("schema").cloned().unwrap_or(Value::Null);
            format!("`{media_type}` {}", type_name(&schema))
        })
        .collect();
    parts.join(", ")
}

/// A schema's type as a reader names it: a linked schema name, `array of
/// X`, `string or null`, `A or B`.
fn type_name(schema: &Value) -> String {
    if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
        let name = reference.rsplit('/').next().unwrap_or(reference);
        return format!("[{name}](#{})", anchor(name));
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        if let Some(options) = schema.get(key).and_then(Value::as_array) {
            let names: Vec<String> = options.iter().map(type_name).collect();
            let joiner = if key == "allOf" { " and " } else { " or " };
            return names.join(joiner);
        }
    }
    let base = match schema.get("type") {
        Some(Value::String(name)) => name.clone(),
        Some(Value::Array(names)) => names.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" or "),
        _ => "any".to_string(),
    };
    match schema.get("items") {
        Some(items) => base.replacen("array", &format!("array of {}", type_name(items)), 1),
        None => base,
    }
}

/// One schema: its description, and its properties or its values.
fn schema_section(name: &str, schema: &Value) -> String {
    let mut out = format!("### {name}\n\n");
    if let Some(description) = schema.get("description").and_then(Value::as_str) {
        let _ = writeln!(out, "{}\n", description.trim_end());
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = values.iter().map(|value| format!("`{}`", value_text(value))).collect();
        let _ = writeln!(out, "One of {}.", values.join(", "));
        return out;
    }
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        let _ = writeln!(out, "Type: {}.", type_name(schema));
        return out;
    };
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    out.push_str("| field | type | required | description |\n| --- | --- | --- | --- |\n");
    for (field, property) in properties {
        let description = property.get("description").and_then(Value::as_str).unwrap_or("");
        let _ = writeln!(
            out,
            "| `{field}` | {} | {} | {} |",
            type_name(property),
            if required.contains(&field.as_str()) {
                "yes"
            } else {
                "no"
            },
            one_line(description)
        );
    }
    out
}

fn value_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The full text of `docs/state-machines.md`.
pub fn state_machines() -> String {
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
