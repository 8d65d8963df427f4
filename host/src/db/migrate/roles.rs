//! A handler's PostgreSQL role, login and schema: made before anything of
//! the handler runs, renewed when its password is not this database's, and
//! refused when it could give the handler's SQL more than its schema.

use super::*;

/// Gives a handler its walls before anything of it runs. PostgreSQL: a
/// login role of its own that owns the handler's schema, may call the host's
/// gates (useless without the host's key) and is a member of no other role,
/// so nothing its SQL does to its session can make it more privileged (see
/// `db::logins`); its password is the host's, made here once per database
/// and kept in `inboxd.handler_logins`. The host's user joins the role (to
/// read the handler's tables for operators). Refused if the role has any
/// attribute or membership that would give its SQL more than its schema.
/// Idempotent, and safe when several hosts (or databases on one server) do it at once.
pub async fn prepare_handler(db: &Database, handler: &str) -> Result<(), DbError> {
    if db.backend() != Backend::Postgres {
        return Ok(());
    }
    // Roles live in a catalog every database of the server shares, and the
    // migration lock is one database's: hosts of two databases preparing a
    // handler of the same name at once can collide on the role's row.
    let mut attempt = 0;
    loop {
        match prepare_role(db, handler).await {
            Err(DbError::Sqlx(sqlx::Error::Database(e)))
                if attempt < 5 && e.message().contains("tuple concurrently updated") =>
            {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
            }
            done => return done,
        }
    }
}

async fn prepare_role(db: &Database, handler: &str) -> Result<(), DbError> {
    let (role, schema) = (handler_role(handler), handler_schema(handler));
    let mut tx = db.begin().await?;
    tx.lock_migrations().await?;
    // Roles are shared by every database on the server, so another database's
    // host may create the same one concurrently: that is not an error.
    let create_role = format!(
        "DO $$ BEGIN CREATE ROLE {role} LOGIN NOINHERIT; \
         EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
    );
    tx.execute(&create_role, &[]).await?;
    let stored = tx
        .query(
            "SELECT password FROM handler_logins WHERE handler = $1",
            &[handler.into()],
        )
        .await?;
    if stored.is_empty() {
        // A role made by an older host (NOLOGIN, no password) gets its login here.
        set_login(&mut tx, handler).await?;
    }
    let join_role = format!(
        "DO $$ BEGIN IF NOT pg_has_role(current_user, '{role}', 'MEMBER') THEN \
         EXECUTE format('GRANT {role} TO %I', current_user); END IF; END $$"
    );
    tx.execute(&join_role, &[]).await?;
    tx.execute(
        &format!("CREATE SCHEMA IF NOT EXISTS {schema} AUTHORIZATION {role}"),
        &[],
    )
    .await?;
    tx.execute(&format!("GRANT USAGE ON SCHEMA inboxd_gate TO {role}"), &[])
        .await?;
    tx.execute(
        &format!("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA inboxd_gate TO {role}"),
        &[],
    )
    .await?;
    if let Some(problem) = role_problem(&mut tx, &role).await? {
        return Err(DbError::HandlerMigration(format!(
            "handler {handler}'s database role {role} {problem}: its SQL would not be walled in; \
             an operator must remove that first"
        )));
    }
    bound_temp_files(&mut tx, &role).await?;
    tx.commit().await
}

/// What one statement of a handler may write to temporary files, where the
/// server sets no bound of its own.
const HANDLER_TEMP_FILE_LIMIT: &str = "1GB";

/// Regression (the review of the eighteenth adversarial read, issue 23):
/// with PostgreSQL's default of no limit, one migration statement over a
/// large `generate_series` wrote 5.8 GB of temporary files in 55 s, and a
/// full disk fails every team's writes. `temp_file_limit` is a superuser's
/// setting, so a handler cannot raise it, and neither can the host's login
/// unless the operator granted it (`GRANT SET ON PARAMETER temp_file_limit
/// TO <login>`, PostgreSQL 15). Where the server has a bound, that one holds;
/// where it has none and the host may not set one, the host says so.
async fn bound_temp_files(tx: &mut Tx, role: &str) -> Result<(), DbError> {
    let unbounded = tx
        .query("SELECT current_setting('temp_file_limit') = '-1'", &[])
        .await?
        .into_iter()
        .next()
        .and_then(|row| row.into_iter().next())
        == Some(SqlValue::Boolean(true));
    if !unbounded {
        return Ok(());
    }
    tx.execute("SAVEPOINT inboxd_temp_files", &[]).await?;
    let set = format!("ALTER ROLE {role} SET temp_file_limit = '{HANDLER_TEMP_FILE_LIMIT}'");
    match tx.execute(&set, &[]).await {
        Ok(_) => tx
            .execute("RELEASE SAVEPOINT inboxd_temp_files", &[])
            .await
            .map(drop),
        Err(DbError::Sqlx(sqlx::Error::Database(e))) if e.code().as_deref() == Some("42501") => {
            tx.execute("ROLLBACK TO SAVEPOINT inboxd_temp_files", &[]).await?;
            tracing::warn!(
                role,
                "the server sets no temp_file_limit and the host's login may not set one for \
                 handler roles: one handler statement can fill the disk with temporary files; \
                 set temp_file_limit in postgresql.conf, or as a superuser GRANT SET ON \
                 PARAMETER temp_file_limit TO the host's login"
            );
            Ok(())
        }
        Err(other) => Err(other),
    }
}

/// A new password for the handler's role, kept in `handler_logins`. The
/// server gets only its SCRAM-SHA-256 verifier (`db::logins::scram_verifier`),
/// so not even a server log of the statement holds the password; the host's
/// own session sends it, which no handler's SQL can see.
async fn set_login(tx: &mut Tx, handler: &str) -> Result<(), DbError> {
    let role = handler_role(handler);
    let password = hex::encode(rand::random::<[u8; 24]>());
    let verifier = crate::db::logins::scram_verifier(&password);
    tx.execute_uncached(&format!("ALTER ROLE {role} LOGIN PASSWORD '{verifier}'"))
        .await?;
    tx.execute(
        "INSERT INTO handler_logins (handler, password) VALUES ($1, $2) \
         ON CONFLICT (handler) DO UPDATE SET password = excluded.password",
        &[handler.into(), password.into()],
    )
    .await
    .map(drop)
}

/// Sets a new password for the handler's role, when the one this database
/// keeps no longer logs in (see `Database::begin_guest`).
pub async fn renew_login(db: &Database, handler: &str) -> Result<(), DbError> {
    let mut tx = db.begin().await?;
    tx.lock_migrations().await?;
    set_login(&mut tx, handler).await?;
    tx.commit().await
}

/// What makes a handler's role more than the owner of its schema, if anything.
async fn role_problem(tx: &mut Tx, role: &str) -> Result<Option<String>, DbError> {
    let rows = tx
        .query(
            "SELECT r.rolsuper OR r.rolcreaterole OR r.rolcreatedb OR r.rolreplication OR r.rolbypassrls, \
                    (SELECT string_agg(m.roleid::regrole::text, ', ') FROM pg_auth_members m WHERE m.member = r.oid) \
             FROM pg_roles r WHERE r.rolname = $1",
            &[role.into()],
        )
        .await?;
    let mut row = rows.into_iter().next().unwrap_or_default().into_iter();
    if row.next() == Some(SqlValue::Boolean(true)) {
        return Ok(Some(
            "has a superuser, CREATEROLE, CREATEDB, REPLICATION or BYPASSRLS attribute".to_owned(),
        ));
    }
    Ok(match row.next() {
        Some(SqlValue::Text(roles)) => Some(format!("is a member of {roles}")),
        _ => None,
    })
}
