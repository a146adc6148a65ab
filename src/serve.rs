//! `opledger serve` and `opledger token new`: the binary's side of the
//! HTTP service — flags, the listener, signals, the tokens file. The
//! service itself is `opledger_http`.

use crate::cli::{Cli, ServeArgs, TokenNewArgs};
use crate::UsageError;
use anyhow::Context;
use opledger_engine::Engine;
use opledger_http::{App, ConnectionLimits, Outputs, Role, ServiceConfig, Tokens};
use opledger_store::Store;
use opledger_supervise::ArtifactDir;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Checks what can be checked before a store is opened: a non-loopback
/// address needs a tokens file, and the tokens file must be usable.
pub fn check(args: &ServeArgs) -> anyhow::Result<Tokens> {
    if !args.bind.ip().is_loopback() && args.tokens.is_none() {
        return Err(UsageError(format!(
            "--bind {} is reachable from other machines; give --tokens FILE (opledger token new) so that \
             every request needs a token",
            args.bind
        ))
        .into());
    }
    match &args.tokens {
        Some(path) => Tokens::load(path).map_err(|error| UsageError(error.to_string()).into()),
        None => Ok(Tokens::none()),
    }
}

/// Serves until SIGTERM or Ctrl-C; the engine is started by the service
/// (readiness waits for it).
pub async fn serve<S: Store>(
    store: S,
    args: &ServeArgs,
    tokens: Tokens,
    artifact_dir: Option<ArtifactDir>,
    cli: &Cli,
) -> anyhow::Result<()> {
    let database_url = cli.database_url.as_str();
    let roots = std::iter::once(crate::ingest::thumbnails_dir(database_url)).chain(args.outputs_dirs.iter().cloned());
    let config = ServiceConfig {
        artifact_dir,
        outputs: Outputs::new(roots, args.max_file_bytes),
        connections: ConnectionLimits {
            header_timeout: args.header_timeout,
            max_connections: args.max_connections as usize,
            shutdown_grace: args.shutdown_grace,
        },
        body_timeout: args.body_timeout,
        max_text_bytes: cli.max_text_bytes,
        tokens,
        allow_anonymous_read: args.allow_anonymous_read,
        body_limit: usize::try_from(args.body_limit).unwrap_or(usize::MAX),
        recovery_interval: args.recovery_interval,
        ..ServiceConfig::default()
    };
    if config.tokens.is_empty() && !config.allow_anonymous_read {
        tracing::warn!("no tokens file and no --allow-anonymous-read: every API route will answer 401");
    }
    let listener = tokio::net::TcpListener::bind(args.bind)
        .await
        .with_context(|| format!("binding {}", args.bind))?;
    let address = listener.local_addr().context("reading the bound address")?;
    println!("opledger serving on http://{address}");
    crate::output::flush();
    let app = App::new(Engine::new(store).with_max_kinds(cli.max_kinds), config);
    opledger_http::serve(app, listener, shutdown_signal()).await?;
    Ok(())
}

/// SIGTERM or SIGINT, whichever comes first.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = match signal(SignalKind::terminate()) {
        Ok(terminate) => terminate,
        Err(error) => {
            tracing::error!(%error, "cannot listen for SIGTERM; only Ctrl-C stops the service");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// `opledger token new`: the token on stdout, once; its entry appended to
/// the tokens file, which is created 0600 and rewritten whole through a
/// temporary file, so a failure leaves the old file as it was.
pub fn token_new(args: &TokenNewArgs) -> anyhow::Result<()> {
    let role = Role::parse(&args.role).ok_or_else(|| UsageError(format!("unknown role {:?}", args.role)))?;
    let name = args.name.trim();
    if name.is_empty() || name.len() > 200 || name.chars().any(char::is_control) {
        return Err(UsageError("--name needs 1 to 200 printable characters".into()).into());
    }
    if !args.kinds.is_empty() && role != Role::Worker {
        return Err(UsageError("--kinds limits worker tokens only".into()).into());
    }
    let existing = match std::fs::read_to_string(&args.tokens_file) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(error) => return Err(error).with_context(|| format!("reading {}", args.tokens_file.display())),
    };
    Tokens::parse(&existing)
        .map_err(|reason| UsageError(format!("tokens file {}: {reason}", args.tokens_file.display())))?;
    if Tokens::parse(&existing).is_ok_and(|tokens| tokens.has_name(name)) {
        return Err(UsageError(format!("the tokens file already has a token named {name:?}")).into());
    }
    let kinds: Vec<String> = args
        .kinds
        .iter()
        .map(|kind| kind.trim().to_string())
        .filter(|kind| !kind.is_empty())
        .collect();
    let (token, entry) = opledger_http::new_token(name, role, kinds).context("drawing a random token")?;
    let mut text = existing;
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    if !text.is_empty() {
        text.push('\n');
    }
    text.push_str(&opledger_http::entry_toml(&entry));
    write_private(&args.tokens_file, &text)?;
    println!("{token}");
    eprintln!(
        "added token {name:?} ({role}) to {}; it is shown only this once",
        args.tokens_file.display()
    );
    Ok(())
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    let directory = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let file_name = path.file_name().context("the tokens file needs a file name")?;
    let temporary = directory.join(format!(".{}.tmp-{}", file_name.to_string_lossy(), std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temporary)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if let Err(error) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(error).with_context(|| format!("writing {}", path.display()));
    }
    Ok(())
}
