//! A migration file cut into its statements: parsed whole, every kind
//! checked, cut at its top-level semicolons by the SQL tokenizer, and each
//! piece parsed back to exactly the statement that was checked.

use super::*;

/// One statement of a migration, checked for its kind, ready to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    /// The statement's own text, cut from the file.
    pub text: String,
    pub statement: Statement,
    pub backend: Backend,
}

/// Parses a migration file and cuts it into statements whose kinds are all
/// allowed. The error names the statement and why.
///
/// The file's depth is bounded before anything is parsed, and the parse runs
/// on the guard's own stack (see [`super::nesting`]), so no migration can
/// overflow the stack of the host that applies it.
pub fn split(backend: Backend, sql: &str) -> Result<Vec<Piece>, Refusal> {
    refuse_nul(sql)?;
    crate::sandbox::nesting::check(dialect(backend), sql)?;
    crate::sandbox::nesting::on_guard_stack(|| split_checked(backend, sql))
}

fn split_checked(backend: Backend, sql: &str) -> Result<Vec<Piece>, Refusal> {
    let dialect = dialect(backend);
    refuse_deferred(backend, sql)?;
    let statements =
        Parser::parse_sql(dialect, sql).map_err(|e| forbidden(format!("cannot parse the migration: {e}")))?;
    for statement in &statements {
        check_kind(statement).map_err(|r| about(statement, r))?;
    }
    let texts = cut(backend, sql)?;
    if texts.len() != statements.len() {
        return Err(forbidden(format!(
            "the migration's {} statements could not be told apart ({} pieces at its semicolons)",
            statements.len(),
            texts.len()
        )));
    }
    texts
        .into_iter()
        .zip(statements)
        .map(|(text, statement)| {
            // What runs must be exactly what was checked.
            match Parser::parse_sql(dialect, &text).as_deref() {
                Ok([one]) if *one == statement => {}
                _ => {
                    return Err(about(
                        &statement,
                        forbidden("its text does not parse back to the same statement"),
                    ));
                }
            }
            // And, on PostgreSQL, as PostgreSQL itself reads it.
            if backend == Backend::Postgres {
                match crate::sandbox::postgres::check(
                    &text,
                    crate::sandbox::postgres::Mode::Migration,
                    SCHEMA_ROW_BYTES,
                    &Default::default(),
                ) {
                    Ok(1) => {}
                    Ok(n) => {
                        let n = forbidden(format!("PostgreSQL reads {n} statements in its text"));
                        return Err(about(&statement, n));
                    }
                    Err(refusal) => return Err(about(&statement, refusal)),
                }
            }
            Ok(Piece {
                text,
                statement,
                backend,
            })
        })
        .collect()
}

/// The migration's text cut at its top-level semicolons; pieces with nothing
/// but whitespace and comments are dropped.
fn cut(backend: Backend, sql: &str) -> Result<Vec<String>, Refusal> {
    let tokens = Tokenizer::new(dialect(backend), sql)
        .tokenize_with_location()
        .map_err(|e| forbidden(format!("cannot read the migration: {e}")))?;
    let lines = line_starts(sql);
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut substantive = false;
    for token in &tokens {
        match &token.token {
            Token::SemiColon => {
                let end = offset(sql, &lines, token.span.start);
                if substantive {
                    pieces.push(sql[start..end].trim().to_owned());
                }
                start = offset(sql, &lines, token.span.end);
                substantive = false;
            }
            Token::Whitespace(_) | Token::EOF => {}
            _ => substantive = true,
        }
    }
    if substantive {
        pieces.push(sql[start..].trim().to_owned());
    }
    Ok(pieces)
}

fn line_starts(sql: &str) -> Vec<usize> {
    std::iter::once(0)
        .chain(sql.match_indices('\n').map(|(i, _)| i + 1))
        .collect()
}

/// The byte offset of a tokenizer location (1-based line and character column).
fn offset(sql: &str, lines: &[usize], at: Location) -> usize {
    let Some(&line_start) = lines.get((at.line as usize).saturating_sub(1)) else {
        return sql.len();
    };
    sql[line_start..]
        .char_indices()
        .nth((at.column as usize).saturating_sub(1))
        .map_or(sql.len(), |(i, _)| line_start + i)
}
