//! A host with no broker and no API, on a throwaway database: where
//! `inboxd check` and `inboxd test` upload a team's handler.
//!
//! The upload goes through the same code as `POST /v1/handlers/NAME`
//! (`registry::upload`), held to a team token's built-in ceilings, so a
//! refusal here is the refusal the API would give, word for word. Then the
//! version loads as a host loads it (`registry::load`), which also builds its
//! statement guard from the tables its migrations made.

use crate::cli::handler_files::HandlerFiles;
use crate::cli::{CliError, failed};
use crate::config::{HandlerConfig, TokenPolicy, WasmConfig, defaults};
use crate::db::{Database, redact_url};
use crate::registry::load::load_uploaded;
use crate::registry::upload::{self, Rules, Upload, UploadError};
use crate::wasm::{HandlerComponent, WasmEngine};
use serde_json::Value;

/// The topic check and test give a handler whose files name none; the
/// deployment names the real ones (`inboxd deploy --topic`).
pub const PLACEHOLDER_TOPIC: &str = "events";

pub struct Scratch {
    pub db: Database,
    engine: WasmEngine,
    /// Where the throwaway SQLite file lives; removed on drop.
    _dir: Option<tempfile::TempDir>,
}

/// Why an upload did not go through: the API's refusal, or something of ours.
pub enum Refusal {
    /// What the admin API would have answered, with its words.
    Refused(String),
    Failed(CliError),
}

impl Scratch {
    /// `database`: a URL (its host tables are made if missing), else a new
    /// SQLite file in a temporary folder.
    pub async fn open(database: Option<&str>) -> Result<Self, CliError> {
        let (url, dir) = match database {
            Some(url) => (url.to_owned(), None),
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("inboxd-test-")
                    .tempdir()
                    .map_err(failed)?;
                let url = format!("sqlite://{}", dir.path().join("test.sqlite").display());
                (url, Some(dir))
            }
        };
        let db = Database::connect(&url, defaults::MAX_CONNECTIONS)
            .await
            .map_err(|e| failed(format!("cannot open {}: {e}", redact_url(&url))))?;
        db.migrate_host()
            .await
            .map_err(|e| failed(format!("cannot make the host's tables: {e}")))?;
        let engine = WasmEngine::new(&WasmConfig::default())
            .map_err(|e| failed(format!("cannot start the WebAssembly engine: {e:#}")))?;
        Ok(Self {
            db,
            engine,
            _dir: dir,
        })
    }

    /// Uploads the handler's files as version 1 (or the next version, on a
    /// database that has it) and loads that version.
    pub async fn deploy(
        &self,
        name: &str,
        files: &HandlerFiles,
    ) -> Result<(HandlerConfig, HandlerComponent), Refusal> {
        let mut settings = files.settings().map_err(Refusal::Failed)?;
        settings
            .entry("topics")
            .or_insert_with(|| vec![PLACEHOLDER_TOPIC].into());
        let upload = Upload {
            name: name.to_owned(),
            component: files.component_bytes().map_err(Refusal::Failed)?,
            settings: Value::Object(settings).to_string(),
            migrations: files.migrations().map_err(Refusal::Failed)?,
            uploaded_by: "inboxd test".into(),
        };
        let policy = TokenPolicy::team_default("inboxd test");
        let rules = Rules {
            config_handlers: &[],
            max_component_bytes: (defaults::MAX_COMPONENT_MB as usize) << 20,
            policy: &policy,
            writer_held_ms: None,
        };
        let uploaded = upload::upload(&self.db, &self.engine, &rules, upload)
            .await
            .map_err(|e| match e {
                UploadError::Database(e) => Refusal::Failed(failed(format!("database: {e}"))),
                refused => Refusal::Refused(refused.to_string()),
            })?;
        // A version that uploads but cannot load would fail on the host too.
        load_uploaded(&self.db, &self.engine, name, uploaded.version)
            .await
            .map_err(|e| Refusal::Refused(e.to_string()))
    }

    pub fn engine(&self) -> &WasmEngine {
        &self.engine
    }

    pub async fn close(self) {
        self.db.close().await;
    }
}

/// The handler's name: --name, else the component's file name as an
/// identifier (`my-handler.wasm` is `my_handler`).
pub fn handler_name(name: Option<&str>, files: &HandlerFiles) -> Result<String, CliError> {
    if let Some(name) = name {
        return Ok(name.to_owned());
    }
    let stem = files
        .component
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    let name: String = stem
        .chars()
        .map(|c| match c {
            'A'..='Z' => c.to_ascii_lowercase(),
            '-' | '.' => '_',
            c => c,
        })
        .collect();
    if crate::config::is_identifier(&name) {
        Ok(name)
    } else {
        Err(CliError::Usage(format!(
            "cannot make a handler name of {:?}: pass --name",
            files.component.display()
        )))
    }
}
