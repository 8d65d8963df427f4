//! `inboxd run` and `inboxd migrate`.

use super::CliError;
use crate::config::Config;
use crate::host::Host;
use std::path::Path;

fn load(path: &Path) -> Result<Config, CliError> {
    Config::load(path).map_err(|e| CliError::Usage(e.to_string()))
}

pub async fn run(config_path: &Path) -> Result<(), CliError> {
    let config = load(config_path)?;
    let shutdown = crate::shutdown::install()
        .map_err(|e| CliError::Failed(format!("cannot install signal handlers: {e}")))?;
    let host = Host::start(&config)
        .await
        .map_err(|e| CliError::Failed(e.to_string()))?;
    tracing::info!(handlers = config.handlers.len(), "inboxd running");
    host.run(shutdown).await;
    tracing::info!("inboxd stopped");
    Ok(())
}

pub async fn migrate(config_path: &Path) -> Result<(), CliError> {
    let config = load(config_path)?;
    let db = crate::db::open(&config)
        .await
        .map_err(|e| CliError::Failed(e.to_string()))?;
    db.close().await;
    println!("migrations applied");
    Ok(())
}
