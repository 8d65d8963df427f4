//! What a handler version is made of on disk: its component, its migrations
//! folder and its settings. `deploy`, `check` and `test` read them the same
//! way, so what a team checks and tests is what it uploads.

use super::CliError;
use serde_json::Value;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct HandlerFiles {
    /// The handler's component (`.wasm`, built for wasm32-wasip2).
    pub component: PathBuf,
    /// A topic to consume (repeat for several). Overrides `topics` in --settings.
    #[arg(long = "topic")]
    pub topics: Vec<String>,
    /// A folder of `NNNN_name.sql` migrations for the handler's own tables.
    #[arg(long)]
    pub migrations: Option<PathBuf>,
    /// A JSON file with any other keys of a [[handlers]] entry (event_id, limits, retry, ...).
    #[arg(long)]
    pub settings: Option<PathBuf>,
}

fn usage(message: impl Into<String>) -> CliError {
    CliError::Usage(message.into())
}

impl HandlerFiles {
    pub fn component_bytes(&self) -> Result<Vec<u8>, CliError> {
        std::fs::read(&self.component)
            .map_err(|e| usage(format!("cannot read {}: {e}", self.component.display())))
    }

    /// The settings as the admin API takes them: the --settings object, with
    /// `topics` from --topic if any were given.
    pub fn settings(&self) -> Result<serde_json::Map<String, Value>, CliError> {
        let settings = match &self.settings {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| usage(format!("cannot read {}: {e}", path.display())))?;
                serde_json::from_str::<Value>(&text)
                    .map_err(|e| usage(format!("{} is not JSON: {e}", path.display())))?
            }
            None => Value::Object(Default::default()),
        };
        let Value::Object(mut settings) = settings else {
            return Err(usage("--settings must hold a JSON object"));
        };
        if !self.topics.is_empty() {
            settings.insert("topics".into(), self.topics.clone().into());
        }
        Ok(settings)
    }

    /// `(file name, SQL)` of every `.sql` file in --migrations, by file name
    /// (the host checks the names and orders them by number).
    pub fn migrations(&self) -> Result<Vec<(String, String)>, CliError> {
        match &self.migrations {
            Some(dir) => read_migrations(dir),
            None => Ok(Vec::new()),
        }
    }
}

fn read_migrations(dir: &Path) -> Result<Vec<(String, String)>, CliError> {
    let entries = std::fs::read_dir(dir).map_err(|e| usage(format!("cannot read {}: {e}", dir.display())))?;
    let mut migrations = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| usage(e.to_string()))?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("sql") {
            continue;
        }
        let sql = std::fs::read_to_string(&path)
            .map_err(|e| usage(format!("cannot read {}: {e}", path.display())))?;
        let file = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        migrations.push((file, sql));
    }
    migrations.sort();
    Ok(migrations)
}
