//! `inboxd check COMPONENT.wasm [--migrations DIR]`: what an upload would
//! refuse, found offline.
//!
//! The component and its migrations are uploaded to a throwaway host
//! ([`Scratch`]) through the API's own upload code: the world and its
//! version, the exports, every import, the size, the settings against a team
//! token's built-in ceilings, and every migration through the handler's
//! walls. A refusal is printed in the API's words and exits 1.

use super::scratch::{Refusal, Scratch, handler_name};
use crate::cli::handler_files::HandlerFiles;
use crate::cli::{CliError, failed};
use crate::db::migrate::own_tables;
use crate::wasm::{HandlerComponent, Interfaces};
use serde_json::json;

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub files: HandlerFiles,
    /// The handler's name (default: the component's file name).
    #[arg(long)]
    pub name: Option<String>,
    /// Check on this database instead of a throwaway SQLite file (a
    /// PostgreSQL URL checks the migrations through PostgreSQL's walls).
    #[arg(long)]
    pub database: Option<String>,
    /// One JSON object on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

pub async fn check(args: CheckArgs) -> Result<(), CliError> {
    let name = handler_name(args.name.as_deref(), &args.files)?;
    let bytes = args.files.component_bytes()?;
    let migrations: Vec<String> = args
        .files
        .migrations()?
        .into_iter()
        .map(|(file, _)| file)
        .collect();
    let scratch = Scratch::open(args.database.as_deref()).await?;
    let checked = scratch.deploy(&name, &args.files).await;
    let result = match checked {
        Ok(_) => {
            let tables = own_tables(&scratch.db, &name).await.map_err(failed)?;
            let shown = args.files.component.display().to_string();
            let interfaces =
                HandlerComponent::interfaces(scratch.engine(), &shown, &bytes).map_err(failed)?;
            report(&args, &name, bytes.len(), &migrations, Ok((interfaces, tables)))
        }
        Err(Refusal::Refused(message)) => report(&args, &name, bytes.len(), &migrations, Err(message)),
        Err(Refusal::Failed(error)) => Err(error),
    };
    scratch.close().await;
    result
}

fn report(
    args: &CheckArgs,
    name: &str,
    size: usize,
    migrations: &[String],
    found: Result<(Interfaces, Vec<String>), String>,
) -> Result<(), CliError> {
    let component = args.files.component.display().to_string();
    if args.json {
        let body = match &found {
            Ok((interfaces, tables)) => json!({
                "ok": true, "handler": name, "component": component, "bytes": size,
                "imports": interfaces.imports, "exports": interfaces.exports,
                "migrations": migrations, "tables": tables,
            }),
            Err(refusal) => json!({
                "ok": false, "handler": name, "component": component, "bytes": size,
                "migrations": migrations, "refused": refusal,
            }),
        };
        println!("{body}");
    } else {
        println!("component {component}: {size} bytes");
        match &found {
            Ok((interfaces, tables)) => {
                println!("  exports: {}", interfaces.exports.join(", "));
                println!("  imports: {}", interfaces.imports.join(", "));
                println!("migrations: {}", list(migrations));
                println!("tables: {}", list(tables));
                println!(
                    "ok: handler {name} would be accepted by a host (a team token with the \
                     built-in ceilings)"
                );
            }
            Err(_) => println!("migrations: {}", list(migrations)),
        }
    }
    match found {
        Ok(_) => Ok(()),
        Err(refusal) => Err(CliError::Failed(format!("refused: {refusal}"))),
    }
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}
