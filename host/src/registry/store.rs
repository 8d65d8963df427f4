//! The `handlers` and `handler_deployments` tables: uploaded versions, and
//! which one runs. Every change is one short transaction; hosts pick it up by
//! polling [`deployments`].

use crate::db::columns::Columns;
use crate::db::migrate::Migration;
use crate::db::{Backend, Database, DbError, SqlValue, Tx, now_ms};

/// One uploaded handler's deployment state.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Deployment {
    pub name: String,
    pub active_version: i64,
    pub previous_version: Option<i64>,
    pub paused: bool,
    pub updated_at: i64,
    /// When the active version was uploaded: with its number, what a host
    /// compares to know it runs that version. A number alone is not enough:
    /// a handler deleted and uploaded again starts again at version 1, and
    /// a host that missed the delete (another host's API, within one poll)
    /// kept running the deleted code as "version 1" (the thirteenth read).
    pub active_uploaded_at: Option<i64>,
}

/// A stored version without its component bytes.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VersionInfo {
    pub version: i64,
    pub sha256: String,
    pub uploaded_at: i64,
    pub uploaded_by: String,
    pub migrations: Vec<String>,
}

/// A stored version, everything a host needs to run it.
pub struct StoredVersion {
    pub version: i64,
    pub component: Vec<u8>,
    pub settings: String,
}

/// Every deployment with its active version's upload time, which SQLite
/// reads from the index `handlers_uploaded_at` (from the table it would walk
/// the component's pages before it: up to 100 MiB a version, every 2 s; and
/// left to itself, SQLite takes the primary key's index, which it knows to
/// be unique).
fn deployments_sql(backend: Backend) -> String {
    let index = match backend {
        Backend::Sqlite => " INDEXED BY handlers_uploaded_at",
        Backend::Postgres => "",
    };
    format!(
        "SELECT d.name, d.active_version, d.previous_version, d.paused, d.updated_at, h.uploaded_at
         FROM handler_deployments d
         LEFT JOIN handlers h{index} ON h.name = d.name AND h.version = d.active_version
         ORDER BY d.name"
    )
}

pub async fn deployments(db: &Database) -> Result<Vec<Deployment>, DbError> {
    let rows = db.query(&deployments_sql(db.backend()), &[]).await?;
    rows.into_iter()
        .map(|row| {
            let mut c = Columns::new("handler_deployments row", row);
            Ok(Deployment {
                name: c.text("name")?,
                active_version: c.int("active_version")?,
                previous_version: c.opt_int("previous_version")?,
                paused: c.int("paused")? != 0,
                updated_at: c.int("updated_at")?,
                active_uploaded_at: c.opt_int("uploaded_at")?,
            })
        })
        .collect()
}

pub async fn deployment(db: &Database, name: &str) -> Result<Option<Deployment>, DbError> {
    Ok(deployments(db).await?.into_iter().find(|d| d.name == name))
}

/// Every version of a handler, without its component or migration SQL:
/// the database picks the migrations' names out (a version's migrations
/// may be most of a 100 MiB upload, and a listing read every version's).
pub async fn versions(db: &Database, name: &str) -> Result<Vec<VersionInfo>, DbError> {
    let names = match db.backend() {
        Backend::Postgres => {
            "(SELECT COALESCE(json_agg(m->>'name' ORDER BY n), '[]'::json)::text \
             FROM json_array_elements(migrations::json) WITH ORDINALITY AS t(m, n))"
        }
        Backend::Sqlite => {
            "(SELECT json_group_array(json_extract(value, '$.name')) FROM json_each(migrations))"
        }
    };
    let rows = db
        .query(
            &format!(
                "SELECT version, sha256, uploaded_at, uploaded_by, {names} AS migrations \
                 FROM handlers WHERE name = $1 ORDER BY version"
            ),
            &[name.into()],
        )
        .await?;
    rows.into_iter()
        .map(|row| {
            let mut c = Columns::new("handlers row", row);
            let version = c.int("version")?;
            let sha256 = c.text("sha256")?;
            let uploaded_at = c.int("uploaded_at")?;
            let uploaded_by = c.text("uploaded_by")?;
            let migrations: Vec<String> = serde_json::from_str(&c.text("migrations")?)
                .map_err(|e| c.wrong("migrations", "a JSON list of migration names", &e.to_string()))?;
            Ok(VersionInfo {
                version,
                sha256,
                uploaded_at,
                uploaded_by,
                migrations,
            })
        })
        .collect()
}

pub async fn load_version(db: &Database, name: &str, version: i64) -> Result<Option<StoredVersion>, DbError> {
    let rows = db
        .query(
            "SELECT component, settings FROM handlers WHERE name = $1 AND version = $2",
            &[name.into(), version.into()],
        )
        .await?;
    let Some(row) = rows.into_iter().next() else {
        return Ok(None);
    };
    let mut c = Columns::new("handlers row", row);
    Ok(Some(StoredVersion {
        version,
        component: c.blob("component")?,
        settings: c.text("settings")?,
    }))
}

/// What a new version carries into the table.
pub struct NewVersion<'a> {
    pub name: &'a str,
    pub sha256: &'a str,
    pub component: &'a [u8],
    pub settings: &'a str,
    pub migrations: &'a [Migration],
    pub uploaded_by: &'a str,
}

/// Stores a new version inside `tx`, makes it the running one, and returns
/// its number (one more than the highest so far).
pub async fn insert_version(tx: &mut Tx, new: &NewVersion<'_>) -> Result<i64, DbError> {
    let rows = tx
        .query(
            "SELECT COALESCE(MAX(version), 0) FROM handlers WHERE name = $1",
            &[new.name.into()],
        )
        .await?;
    let version = rows
        .first()
        .and_then(|r| r.first())
        .and_then(SqlValue::as_i64)
        .unwrap_or(0)
        + 1;
    let migrations = serde_json::to_string(new.migrations).expect("migrations serialize");
    tx.execute(
        "INSERT INTO handlers (name, version, sha256, component, settings, migrations, uploaded_at, uploaded_by)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        &[
            new.name.into(),
            version.into(),
            new.sha256.into(),
            SqlValue::Blob(new.component.to_vec()),
            new.settings.into(),
            migrations.into(),
            now_ms().into(),
            new.uploaded_by.into(),
        ],
    )
    .await?;
    set_active(tx, new.name, version).await?;
    prune_versions(tx, new.name, version).await?;
    Ok(version)
}

/// Versions a handler keeps: the newest this many, and its active and
/// rollback ones whatever their age. Every upload stored its component (up
/// to `admin.max_component_mb`) for good, so a team uploading in a loop
/// filled the disk every team's database lives on (the eighth read of this
/// round, issue 23).
pub const KEPT_VERSIONS: i64 = 10;

/// Deletes `name`'s versions older than the newest [`KEPT_VERSIONS`] (its
/// newest being `newest`), except its active and rollback ones.
async fn prune_versions(tx: &mut Tx, name: &str, newest: i64) -> Result<(), DbError> {
    tx.execute(
        "DELETE FROM handlers WHERE name = $1 AND version <= $2
           AND version NOT IN (SELECT active_version FROM handler_deployments WHERE name = $1)
           AND version NOT IN (SELECT previous_version FROM handler_deployments
                               WHERE name = $1 AND previous_version IS NOT NULL)",
        &[name.into(), (newest - KEPT_VERSIONS).into()],
    )
    .await?;
    Ok(())
}

/// Makes `version` the running one; the one it replaces becomes the rollback target.
pub async fn set_active(tx: &mut Tx, name: &str, version: i64) -> Result<(), DbError> {
    tx.execute(
        "INSERT INTO handler_deployments (name, active_version, previous_version, paused, updated_at)
         VALUES ($1, $2, NULL, 0, $3)
         ON CONFLICT (name) DO UPDATE SET
           previous_version = CASE WHEN handler_deployments.active_version = excluded.active_version
                                   THEN handler_deployments.previous_version
                                   ELSE handler_deployments.active_version END,
           active_version = excluded.active_version,
           updated_at = excluded.updated_at",
        &[name.into(), version.into(), now_ms().into()],
    )
    .await?;
    Ok(())
}

/// A stored version's settings (JSON), or `None` if there is no such version.
pub async fn version_settings(tx: &mut Tx, name: &str, version: i64) -> Result<Option<String>, DbError> {
    let rows = tx
        .query(
            "SELECT settings FROM handlers WHERE name = $1 AND version = $2",
            &[name.into(), version.into()],
        )
        .await?;
    Ok(rows
        .first()
        .and_then(|r| r.first())
        .and_then(SqlValue::as_str)
        .map(str::to_owned))
}

/// `(name, settings)` of every uploaded handler's active version, paused
/// ones included (they resume in their group).
pub async fn active_settings(tx: &mut Tx) -> Result<Vec<(String, String)>, DbError> {
    let rows = tx
        .query(
            "SELECT h.name, h.settings FROM handlers h
             JOIN handler_deployments d ON d.name = h.name AND d.active_version = h.version
             ORDER BY h.name",
            &[],
        )
        .await?;
    rows.into_iter()
        .map(|row| {
            let mut c = Columns::new("active handler version", row);
            Ok((c.text("name")?, c.text("settings")?))
        })
        .collect()
}

/// Makes the transactions that change which version is active take turns,
/// so two of them cannot both find a consumer group free and both take it.
/// SQLite: `BEGIN IMMEDIATE` already does. PostgreSQL: a lock that conflicts
/// with itself and with writes of the table, not with reads (the hosts' polls).
pub async fn lock_deployments(tx: &mut Tx) -> Result<(), DbError> {
    if tx.backend() == crate::db::Backend::Postgres {
        tx.execute("LOCK TABLE handler_deployments IN SHARE ROW EXCLUSIVE MODE", &[])
            .await?;
    }
    Ok(())
}

pub async fn set_paused(db: &Database, name: &str, paused: bool) -> Result<bool, DbError> {
    let mut tx = db.begin_immediate().await?;
    let changed = tx
        .execute(
            "UPDATE handler_deployments SET paused = $2, updated_at = $3 WHERE name = $1",
            &[name.into(), i64::from(paused).into(), now_ms().into()],
        )
        .await?;
    tx.commit().await?;
    Ok(changed == 1)
}

/// Removes a handler's deployment and versions. Its inbox rows, dead letters
/// and tables stay: uploading it again continues where it was.
pub async fn delete(db: &Database, name: &str) -> Result<bool, DbError> {
    let mut tx = db.begin_immediate().await?;
    lock_deployments(&mut tx).await?;
    let changed = tx
        .execute("DELETE FROM handler_deployments WHERE name = $1", &[name.into()])
        .await?;
    tx.execute("DELETE FROM handlers WHERE name = $1", &[name.into()])
        .await?;
    tx.commit().await?;
    Ok(changed == 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::test_support::each_backend;

    /// Regression (issue 23, fourth read): listing versions parsed every
    /// version's migrations, SQL included, to show their names. The
    /// database picks the names out now, also of a version with none.
    #[tokio::test]
    async fn versions_list_migration_names_without_their_sql() {
        for db in each_backend().await {
            let migration = |version: i64, name: &str| Migration {
                version,
                name: name.into(),
                sql: format!("-- {}\nCREATE TABLE t{version} (id INTEGER)", "x".repeat(10_000)),
            };
            for migrations in [
                vec![migration(1, "0001_a.sql"), migration(2, "0002_b.sql")],
                vec![],
            ] {
                let mut tx = db.begin().await.unwrap();
                let new = NewVersion {
                    name: "billing",
                    sha256: "00",
                    component: b"\0asm",
                    settings: "{}",
                    migrations: &migrations,
                    uploaded_by: "ops",
                };
                insert_version(&mut tx, &new).await.unwrap();
                tx.commit().await.unwrap();
            }
            let listed = versions(&db, "billing").await.unwrap();
            let names: Vec<(i64, Vec<String>)> =
                listed.into_iter().map(|v| (v.version, v.migrations)).collect();
            assert_eq!(
                names,
                [
                    (1, vec!["0001_a.sql".to_owned(), "0002_b.sql".to_owned()]),
                    (2, vec![])
                ],
                "{:?}",
                db.backend()
            );
        }
    }

    /// A stored version of `name` with an empty component and no migrations.
    fn version_of(name: &str) -> NewVersion<'_> {
        NewVersion {
            name,
            sha256: "00",
            component: b"\0asm",
            settings: "{}",
            migrations: &[],
            uploaded_by: "team",
        }
    }

    #[tokio::test]
    async fn a_handler_keeps_its_newest_versions_and_its_rollback_target() {
        for db in each_backend().await {
            let new = version_of("loop");
            let upload = || async {
                let mut tx = db.begin().await.unwrap();
                insert_version(&mut tx, &new).await.unwrap();
                tx.commit().await.unwrap();
            };
            for _ in 0..18 {
                upload().await;
            }
            let kept = || async {
                let listed = versions(&db, "loop").await.unwrap();
                listed.iter().map(|v| v.version).collect::<Vec<i64>>()
            };
            assert_eq!(kept().await, (9..=18).collect::<Vec<_>>(), "{:?}", db.backend());
            // Rolled back to 9, then one more upload: 9 is the rollback
            // target now, kept though it is not among the ten newest.
            let mut tx = db.begin().await.unwrap();
            set_active(&mut tx, "loop", 9).await.unwrap();
            tx.commit().await.unwrap();
            upload().await;
            assert_eq!(kept().await, (9..=19).collect::<Vec<_>>(), "{:?}", db.backend());
            let deployment = deployment(&db, "loop").await.unwrap().unwrap();
            assert_eq!(
                (deployment.active_version, deployment.previous_version),
                (19, Some(9))
            );
        }
    }

    /// Regression (the thirteenth read of issue 23's third round): a
    /// handler deleted and uploaded again is version 1 again, and a host that
    /// compared version numbers alone kept running the deleted code. A
    /// deployment also says when its active version was uploaded.
    #[tokio::test]
    async fn a_handler_uploaded_again_after_a_delete_is_told_apart() {
        for db in each_backend().await {
            let new = version_of("again");
            let upload = || async {
                let mut tx = db.begin().await.unwrap();
                let version = insert_version(&mut tx, &new).await.unwrap();
                set_active(&mut tx, "again", version).await.unwrap();
                tx.commit().await.unwrap();
            };
            upload().await;
            let first = deployment(&db, "again").await.unwrap().unwrap();
            assert!(first.active_uploaded_at.is_some());
            assert!(delete(&db, "again").await.unwrap());
            // The upload's millisecond stamp must differ.
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            upload().await;
            let second = deployment(&db, "again").await.unwrap().unwrap();
            assert_eq!(
                (first.active_version, second.active_version),
                (1, 1),
                "{:?}",
                db.backend()
            );
            assert_ne!(
                first.active_uploaded_at,
                second.active_uploaded_at,
                "{:?}",
                db.backend()
            );
            if db.backend() == crate::db::Backend::Sqlite {
                let plan = db
                    .query(
                        &format!("EXPLAIN QUERY PLAN {}", deployments_sql(db.backend())),
                        &[],
                    )
                    .await
                    .unwrap();
                let plan = format!("{plan:?}");
                assert!(plan.contains("COVERING INDEX handlers_uploaded_at"), "{plan}");
            }
        }
    }
}
