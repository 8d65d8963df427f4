//! Opening the configured database: connect, apply the host's migrations,
//! refuse code planted by an older version, apply every configured
//! handler's migrations. What `inboxd run`, `migrate` and every command that
//! reads the database do first.

use super::{Database, DbError, audit, migrate};
use crate::config::Config;

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot open the database {url}: {source}")]
    Connect { url: String, source: DbError },
    #[error("cannot migrate the database: {0}")]
    Migrate(#[from] DbError),
    #[error(
        "the database holds code that handlers may not plant and that would run outside the walls: {0}. \
         An older inboxd let a handler's migration create it; drop it (DROP TRIGGER / FUNCTION / RULE / POLICY; \
         on SQLite a table or view that today's migration rules refuse: make it again as they allow, copying \
         its rows) and start again"
    )]
    PlantedCode(String),
}

/// Connects and applies the host's migrations and every configured handler's.
pub async fn open(config: &Config) -> Result<Database, OpenError> {
    prepare(connect(config).await?, config).await
}

fn connect(config: &Config) -> impl Future<Output = Result<Database, OpenError>> + '_ {
    let url = &config.database.url;
    async move {
        Database::connect(url, config.database.max_connections)
            .await
            .map_err(|source| OpenError::Connect {
                url: redact_url(url),
                source,
            })
    }
}

/// The host's migrations, the audit and every configured handler's
/// migrations, on a connected database. Not bounded in time here: a
/// handler's migration files have their own deadline each.
async fn prepare(db: Database, config: &Config) -> Result<Database, OpenError> {
    db.migrate_host().await?;
    let planted = audit::planted_code(&db).await?;
    if !planted.is_empty() {
        return Err(OpenError::PlantedCode(planted.join(", ")));
    }
    for handler in &config.handlers {
        migrate::prepare_handler(&db, &handler.name).await?;
        if let Some(dir) = &handler.migrations {
            migrate::apply_handler(&db, &handler.name, dir).await?;
        }
    }
    Ok(db)
}

/// As [`open`], waiting out a database that cannot be reached yet (a
/// restart, a network cut) for up to `wait`, with backoff; any other error,
/// or the same one past `wait`, is returned at once. For `inboxd run`: a
/// host its supervisor restarts during an outage would otherwise exit again
/// at once, and stay down for the supervisor's growing backoff. Commands an
/// operator types keep [`open`], which fails at once.
pub async fn open_waiting(config: &Config, wait: std::time::Duration) -> Result<Database, OpenError> {
    let started = std::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(250);
    loop {
        // Only connecting is bounded by what is left of `wait` (a network
        // that stops answering would otherwise hold it for TCP's minutes);
        // the migrations after it take as long as their own deadlines allow.
        let left = wait
            .saturating_sub(started.elapsed())
            .max(std::time::Duration::from_secs(1));
        let attempt = match tokio::time::timeout(left, connect(config)).await {
            Ok(Ok(db)) => prepare(db, config).await,
            Ok(Err(e)) => Err(e),
            Err(_) => Err(OpenError::Connect {
                url: redact_url(&config.database.url),
                source: DbError::NoAnswer { waited: left },
            }),
        };
        match attempt {
            Err(e) if e.is_connection_failure() && started.elapsed() + pause < wait => {
                tracing::warn!("{e}; retrying for up to {}s", wait.as_secs());
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(5));
            }
            done => return done,
        }
    }
}

impl OpenError {
    /// The database could not be reached, or the connection broke on the way.
    fn is_connection_failure(&self) -> bool {
        match self {
            OpenError::Connect { source, .. } | OpenError::Migrate(source) => source.is_connection_failure(),
            OpenError::PlantedCode(_) => false,
        }
    }
}

/// Hides a password in a database URL before it is shown.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_are_hidden() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/x"),
            "postgres://app:***@db:5432/x"
        );
        assert_eq!(redact_url("sqlite://inboxd.sqlite"), "sqlite://inboxd.sqlite");
    }
}
