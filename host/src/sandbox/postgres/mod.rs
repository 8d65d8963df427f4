//! The statement guard's second reading on PostgreSQL: the text as
//! PostgreSQL's own parser (libpg_query, through the `pg_query` crate) reads
//! it, so no syntax the guard's parser reads otherwise can slip past.
//!
//! PostgreSQL turns syntax that looks like no call into function calls:
//! attribute notation `(x).f` and `a.b.f` are `f(x)`, a cast runs its type's
//! input function, an operator is a function, and the SQL-standard forms
//! (`POSITION(a IN b)`, `TRIM(... FROM x)`, `x AT TIME ZONE z`) are calls of
//! `pg_catalog` functions. The statement is checked against allowlists over
//! PostgreSQL's raw parse tree: every node kind ([`RUN_TIME_NODES`],
//! [`MIGRATION_NODES`]), every function by name ([`PURE_FUNCTIONS`] and the
//! standard forms' [`STANDARD_FORM_FUNCTIONS`]), every operator
//! ([`OPERATORS`]) and every cast's type ([`CAST_TYPES`]). Everything else is
//! refused with a message that names it. The walk is over the whole tree
//! (serialised, then visited with an explicit stack), so no field of any
//! node is left unvisited and no recursion depends on the input.
//!
//! sqlparser stays the guard for what it does well: statement kinds, which
//! tables a statement reads and writes with SQL's CTE scoping, and cutting a
//! migration into statements; SQLite's dialect needs it anyway. Both readings
//! must accept a statement. What neither catches, PostgreSQL's privileges
//! stop: the session is the handler's own login (see `db::logins`).
//!
//! Note: the parser is PostgreSQL 18's grammar; servers from 15 on are
//! supported. Syntax new in 16-18 that an older server does not know fails
//! there as a syntax error; nothing older reads differently.

mod allowlists;
mod calls;
mod ddl_bounds;
pub(crate) mod fences;
pub(crate) mod nodes;
mod operators;
mod plain_insert;
pub mod plan_cache;
pub(super) mod plan_memory;
mod rows;
mod sorted_limits;
mod types;
mod unspilled;
mod zones;

pub use calls::STANDARD_FORM_FUNCTIONS;
use calls::check_call;
pub use plain_insert::PlainInsert;
pub use types::{JSONB_REFUSED, TIME_REFUSED};
use types::{check_cast, check_column_type, check_sql_value_function};
pub use zones::zone_free;

use super::guard::Refusal;
use allowlists::{MIGRATION_NODES, RUN_TIME_NODES};
use operators::{check_operator_expr, check_operator_name};
use serde_json::Value;

/// What the statement may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A guest's statement at run time: one SELECT, INSERT, UPDATE or DELETE.
    RunTime,
    /// One statement of a handler's migration (its kind was checked by the
    /// migration guard): also the DDL the migration guard allows.
    Migration,
}

/// Operators (all PostgreSQL's own, in `pg_catalog`): comparison,
/// arithmetic, bitwise, concatenation and JSON field access. Not
/// here: LIKE's (`~~` and kin), array and JSON containment and overlap
/// (`@>`, `<@`, `&&`, `?|`, `?&`): nested loops over both sides that no
/// deadline interrupts,
/// regular expressions (`~`, `~*`, `!~`, `SIMILAR TO`), text search (`@@`),
/// geometric and network operators.
/// Not `^` either: on numeric it builds a number of up to 131,072 digits.
/// Nor `?`: it exists only for jsonb, so PostgreSQL reads an untyped literal
/// beside it as jsonb (see [`JSONB_REFUSED`]).
pub const OPERATORS: &[&str] = &[
    "=", "<>", "<", ">", "<=", ">=", "+", "-", "*", "/", "%", "||", "&", "|", "#", "<<", ">>", "->", "->>",
    "#>", "#>>",
];

/// The work a write to each of a handler's tables adds by the table's own
/// expressions (see `db::migrate::hidden_work`).
pub type Hidden = std::collections::BTreeMap<String, u64>;

/// What the guard knows of the database it guards.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    /// The work a write to each of the handler's tables adds by the table's
    /// own expressions (`db::migrate::hidden_work`).
    pub hidden: Hidden,
    /// The names of the functions PostgreSQL could call on a whole row
    /// (`db::migrate::row_functions`): see [`check_row_calls`]. `None`: not
    /// read, for a check that the database's own one follows (a migration's
    /// first reading at upload) and for tests.
    pub row_functions: Option<std::collections::BTreeSet<String>>,
}

/// Checks `sql` as PostgreSQL reads it, with every row and bound value at
/// most `row_bytes` and what `catalog` knows of the database (see
/// [`super::work`] and [`check_row_calls`]); `Ok`: how many statements it holds.
pub fn check(sql: &str, mode: Mode, row_bytes: u64, catalog: &Catalog) -> Result<usize, Refusal> {
    checked(sql, mode, row_bytes, catalog).map(|(statements, ..)| statements)
}

/// What [`check_run_time`] found in an approved statement.
#[derive(Debug, Clone)]
pub struct RunTime {
    /// How many statements PostgreSQL reads in the text.
    pub statements: usize,
    /// The parameters a date or time cast reads as text, whose values the
    /// host checks for time zones before it binds them ([`zones`]).
    pub zoned_params: Vec<usize>,
    /// Whether the handler's session may keep it prepared ([`plan_cache`]).
    pub keep_prepared: bool,
}

/// As [`check`] for a guest's statement at run time.
pub fn check_run_time(sql: &str, row_bytes: u64, catalog: &Catalog) -> Result<RunTime, Refusal> {
    let (statements, tree, zoned_params) = checked(sql, Mode::RunTime, row_bytes, catalog)?;
    Ok(RunTime {
        statements,
        zoned_params,
        keep_prepared: plan_cache::keeps(sql, &tree),
    })
}

/// Tokens one statement text may hold. The guard reads PostgreSQL's parse
/// tree as JSON, several kilobytes per token: a 1 MiB migration of
/// `SELECT 1,1,...` held 4.06 GB of the host for 53 s before the node
/// bound refused it, and 64 KiB (the default `max_statement_bytes`) 250 MB
/// (the fifty-second read, issue 23). At this bound a tree is at most about
/// 64 MB; a statement of ordinary SQL reaches it at about 80 KB.
pub const MAX_TOKENS: usize = 16_384;

/// Trees of more than this many tokens are read a few at a time in the whole
/// process ([`LARGE_AT_ONCE`]): every handler version judges two texts at
/// once, and migrations are read on blocking threads too.
const LARGE_TOKENS: usize = 2_048;
const LARGE_AT_ONCE: usize = 4;

/// Large trees being read, and the tickets of those waiting, first come
/// first served (so no handler's texts can keep another's waiting: the
/// review of the fifty-second read).
struct Large {
    reading: usize,
    waiting: std::collections::VecDeque<u64>,
    next: u64,
}

static LARGE: (std::sync::Mutex<Large>, std::sync::Condvar) = (
    std::sync::Mutex::new(Large {
        reading: 0,
        waiting: std::collections::VecDeque::new(),
        next: 0,
    }),
    std::sync::Condvar::new(),
);

/// A place among the [`LARGE_AT_ONCE`] large trees, held while one is read.
struct LargeSlot;

impl LargeSlot {
    /// Waits for a place, in turn (on a blocking thread, never a runtime worker).
    fn take() -> Self {
        let (large, changed) = &LARGE;
        let mut state = large.lock().unwrap_or_else(|p| p.into_inner());
        let ticket = state.next;
        state.next += 1;
        state.waiting.push_back(ticket);
        while state.reading >= LARGE_AT_ONCE || state.waiting.front() != Some(&ticket) {
            state = changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        state.waiting.pop_front();
        state.reading += 1;
        changed.notify_all();
        LargeSlot
    }
}

impl Drop for LargeSlot {
    fn drop(&mut self) {
        let (large, changed) = &LARGE;
        large.lock().unwrap_or_else(|p| p.into_inner()).reading -= 1;
        changed.notify_all();
    }
}

/// Refuses a text of more than [`MAX_TOKENS`] tokens, before its tree is
/// built; for a large one, waits for a [`LargeSlot`] (on the blocking thread
/// the guard runs on, never a runtime worker).
fn tokens_within_bound(sql: &str) -> Result<Option<LargeSlot>, Refusal> {
    if bounded_tokens(sql)? <= LARGE_TOKENS {
        return Ok(None);
    }
    Ok(Some(LargeSlot::take()))
}

/// The tokens of `sql`, refused past [`MAX_TOKENS`] or past
/// [`MAX_COPIED_TOKENS`] once multiple assignments are copied out.
fn bounded_tokens(sql: &str) -> Result<usize, Refusal> {
    let scanned = match pg_query::scan_tokens(sql) {
        Ok(tokens) => tokens,
        // The parser says what is wrong with it (the same scanner).
        Err(_) => return Ok(0),
    };
    let tokens = scanned.len();
    if tokens > MAX_TOKENS {
        return Err(Refusal::Limit(format!(
            "the statement has {tokens} tokens, at most {MAX_TOKENS}: the statement guard reads \
             PostgreSQL's parse tree of it, several kilobytes per token; split it into smaller statements"
        )));
    }
    let copies = assigned_copies(&scanned);
    if copies > MAX_COPIED_TOKENS {
        return Err(Refusal::Limit(format!(
            "the statement's parenthesized lists before `=` name {copies} tokens' worth of copies, at \
             most {MAX_COPIED_TOKENS}: PostgreSQL's parse tree holds `SET (a, b, ...) = source` with a copy \
             of the source for each name; assign fewer columns at a time (`SET a = x, b = y`)"
        )));
    }
    Ok(tokens)
}

/// Tokens PostgreSQL's parse tree may hold once multiple assignments are
/// copied out ([`assigned_copies`]).
const MAX_COPIED_TOKENS: usize = 4 * MAX_TOKENS;

/// An upper bound on the tokens a tree holds in copies: PostgreSQL's
/// grammar gives each name of `SET (a, b, ...) = source` (in UPDATE, ON
/// CONFLICT DO UPDATE and MERGE) a node pointing at the one source, and the
/// tree it hands out writes that source once per name. Regression (the
/// review of the fifty-second read): `SET (a, a, ..., a) = (1, 1, ..., 1)`,
/// 10 KB of 10,007 tokens, made 344 MB of JSON. A list of two or more in
/// parentheses after `SET` or a `,` and before `=` (comments skipped: the
/// scanner returns them, the parser does not see them) multiplies the
/// statement's tokens by its names, and lists nested in each other's
/// sources multiply together (the second review: a data-modifying CTE in
/// each level's source made n^depth copies), so the product of every such
/// list's names bounds them all.
fn assigned_copies(tokens: &[pg_query::protobuf::ScanToken]) -> usize {
    use pg_query::protobuf::Token;
    let code = |t: Token| t as i32;
    let words: Vec<i32> = tokens
        .iter()
        .map(|t| t.token)
        .filter(|t| *t != code(Token::SqlComment) && *t != code(Token::CComment))
        .collect();
    let (open, close, comma, equals) = (40, 41, 44, 61);
    // The innermost open list, whether it follows SET or a comma, and its
    // commas so far.
    let mut list: Option<(bool, usize)> = None;
    let mut names = 1usize;
    for (i, word) in words.iter().enumerate() {
        if *word == open {
            let after = i.checked_sub(1).map(|j| words[j]);
            list = Some((after == Some(code(Token::Set)) || after == Some(comma), 0));
        } else if *word == comma {
            if let Some((_, commas)) = list.as_mut() {
                *commas += 1;
            }
        } else if *word == close
            && let Some((true, commas @ 1..)) = list.take()
            && words.get(i + 1) == Some(&equals)
        {
            names = names.saturating_mul(commas + 1);
        }
    }
    if names == 1 {
        0
    } else {
        names.saturating_mul(tokens.len())
    }
}

fn checked(
    sql: &str,
    mode: Mode,
    row_bytes: u64,
    catalog: &Catalog,
) -> Result<(usize, Value, Vec<usize>), Refusal> {
    let hidden = &catalog.hidden;
    let _slot = tokens_within_bound(sql)?;
    let parsed = pg_query::parse(sql, pg_query::ParserOptions::DEFAULT).map_err(|e| match e {
        pg_query::Error::Decode(_) => Refusal::Limit(
            "PostgreSQL's parse tree of this statement is nested too deeply for the statement guard \
             (about 40 operators in one chain at most): split the expression"
                .into(),
        ),
        other => forbidden(format!("PostgreSQL cannot parse this statement ({other})")),
    })?;
    let statements = parsed.protobuf.stmts.len();
    let tree = serde_json::to_value(&parsed.protobuf).map_err(|e| {
        forbidden(format!(
            "the statement guard cannot read PostgreSQL's parse tree ({e})"
        ))
    })?;
    walk(&tree, mode, catalog.row_functions.as_ref())?;
    if mode == Mode::Migration {
        ddl_bounds::check(&tree)?;
    }
    sorted_limits::check_sorts(&tree, row_bytes)?;
    unspilled::check_exists_placement(&tree)?;
    let view = parsed.protobuf.stmts.iter().any(|s| {
        matches!(
            s.stmt.as_ref().and_then(|n| n.node.as_ref()),
            Some(pg_query::NodeEnum::ViewStmt(_))
        )
    });
    let copied = if view {
        plan_cache::check_view_text(sql)?;
        unspilled::check_view_rows(&tree)?;
        plan_memory::check_view(&tree)?;
        super::work::check_view(&tree, row_bytes)?
    } else {
        let written = super::work::written_tables(&tree);
        let hidden = written
            .iter()
            .filter_map(|t| hidden.get(&t.to_ascii_lowercase()).or_else(|| hidden.get(*t)))
            .fold(0u64, |sum, ns| sum.saturating_add(*ns));
        super::work::check(&tree, row_bytes, hidden)?
    };
    plan_memory::check(&tree, copied)?;
    rows::check(&tree)?;
    let zoned = zones::check(&tree)?;
    Ok((statements, tree, zoned))
}

/// The work of one row of `sql` by [`super::work`]'s weights, in nanoseconds
/// (tests measure the weights against a real server with it).
pub fn row_work_ns(sql: &str, row_bytes: u64) -> Result<u64, Refusal> {
    // Also what PostgreSQL deparsed of a table's stored expressions, read at
    // every load: bounded as a statement is (the second review of the
    // fifty-second read), though without a large tree's turn.
    bounded_tokens(sql)?;
    let parsed = pg_query::parse(sql, pg_query::ParserOptions::DEFAULT)
        .map_err(|e| forbidden(format!("PostgreSQL cannot parse this statement ({e})")))?;
    let tree = serde_json::to_value(&parsed.protobuf).map_err(|e| forbidden(e.to_string()))?;
    super::work::row_work_ns(&tree, row_bytes, 0)
}

/// Where a node stands, for the checks that depend on it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Anywhere,
    /// Directly in a `FROM` function (through its `List`s): a table function.
    TableFunction,
}

/// What the walk gathers for the checks that span nodes.
#[derive(Default)]
struct Facts<'a> {
    /// Functions in FROM: the name a column reference may qualify them by
    /// (their alias, or the function's own name), and their column names.
    from_functions: Vec<(&'a str, Vec<&'a str>)>,
    /// Two-part column references `q.name`.
    qualified: Vec<(&'a str, &'a str)>,
}

fn walk(
    tree: &Value,
    mode: Mode,
    row_functions: Option<&std::collections::BTreeSet<String>>,
) -> Result<(), Refusal> {
    let mut facts = Facts::default();
    let mut stack = vec![(tree, Place::Anywhere)];
    while let Some((value, place)) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items.iter().map(|v| (v, place))),
            Value::Object(fields) => {
                // A `Node` is `{"node": {Kind: {...}}}` (or `{"node": null}`).
                if let (1, Some(Value::Object(kind))) = (fields.len(), fields.get("node")) {
                    if let Some((name, inner)) = kind.iter().next() {
                        let inside = check_node(name, inner, place, mode)?;
                        gather(name, inner, &mut facts);
                        stack.push((inner, inside));
                    }
                    continue;
                }
                // A statement's WITH is a field of it, not a `Node`.
                if let Some(with) = fields.get("with_clause") {
                    unspilled::check_recursive_union(with)?;
                    fences::check_with(with)?;
                }
                if let Some(Value::Object(into)) = fields.get("into_clause")
                    && mode == Mode::RunTime
                    && !into.is_empty()
                {
                    return Err(forbidden("SELECT ... INTO creates a table"));
                }
                stack.extend(fields.values().map(|v| (v, place)));
            }
            _ => {}
        }
    }
    check_function_columns(&facts)?;
    check_row_calls(&facts, row_functions)
}

fn gather<'a>(kind: &str, node: &'a Value, facts: &mut Facts<'a>) {
    match kind {
        "ColumnRef" => {
            if let [qualifier, name] = strings(node.get("fields")).as_slice() {
                facts.qualified.push((qualifier, name));
            }
        }
        "RangeFunction" => {
            let alias = node.get("alias");
            let columns = strings(alias.and_then(|a| a.get("colnames")));
            match alias.and_then(|a| a.get("aliasname")).and_then(Value::as_str) {
                Some(alias) => facts.from_functions.push((alias, columns)),
                // Unaliased, each function is known by its own name.
                None => {
                    let calls = node.get("functions").and_then(Value::as_array);
                    for call in calls.into_iter().flatten() {
                        let items = call
                            .get("node")
                            .and_then(|n| n.get("List"))
                            .and_then(|l| l.get("items"));
                        let first = items.and_then(Value::as_array).and_then(|i| i.first());
                        let name = first.and_then(|f| f.get("node")?.get("FuncCall")?.get("funcname"));
                        if let Some(name) = strings(name).last() {
                            facts.from_functions.push((name, Vec::new()));
                        }
                    }
                }
            }
        }
        _ => {}
    }
}

/// Regression (an adversarial read, issue 23): PostgreSQL reads `q.name` as
/// the call `name(q)` when `name` is not a column of `q`, and a function in
/// FROM that returns a plain value makes `q` that value: `SELECT u.ts_stat
/// FROM unnest(ARRAY[$1]) AS u` ran `$1` as a query. A reference qualified by
/// a FROM function must name one of the columns its alias declares.
fn check_function_columns(facts: &Facts<'_>) -> Result<(), Refusal> {
    for (qualifier, name) in &facts.qualified {
        let undeclared = facts
            .from_functions
            .iter()
            .any(|(alias, columns)| alias == qualifier && !columns.contains(name));
        if undeclared {
            return Err(forbidden(format!(
                "{qualifier}.{name} is not allowed: {qualifier} is a function in FROM, and PostgreSQL reads \
                 {qualifier}.{name} as the call {name}({qualifier}) unless {name} is one of its columns: name \
                 them, as in `AS {qualifier}({name})`"
            )));
        }
    }
    Ok(())
}

/// Regression (the ninth adversarial read, issue 23): PostgreSQL reads
/// `q.name` as the call `name(q)` on q's whole row whenever q has no column
/// `name`, whatever q is (a table, a view, a subquery, a CTE). So
/// `t.json_build_array` built megabytes of JSON from a row in one call no
/// deadline interrupts, and `t.json_agg` ran an aggregate the guard refuses
/// by name. Which functions could be called that way is the database's own
/// knowledge (`row_functions`, read from `pg_proc`), so a qualified name
/// that is one of them is refused; written unqualified it can only be a column.
fn check_row_calls(
    facts: &Facts<'_>,
    row_functions: Option<&std::collections::BTreeSet<String>>,
) -> Result<(), Refusal> {
    let Some(functions) = row_functions else {
        return Ok(());
    };
    match facts.qualified.iter().find(|(_, name)| functions.contains(*name)) {
        Some((qualifier, name)) => Err(forbidden(format!(
            "{qualifier}.{name} is not allowed: PostgreSQL reads it as the call {name}({qualifier}) on the \
             whole row when {qualifier} has no column {name}, and {name} is such a function: write the column \
             unqualified, or give it another name in a subquery (`excluded.{name}`: rename the column)"
        ))),
        None => Ok(()),
    }
}

/// Checks one node; returns the place its children stand in.
fn check_node(kind: &str, node: &Value, place: Place, mode: Mode) -> Result<Place, Refusal> {
    let allowed =
        RUN_TIME_NODES.contains(&kind) || mode == Mode::Migration && MIGRATION_NODES.contains(&kind);
    if !allowed {
        return Err(forbidden(format!("{} is not allowed", describe(kind))));
    }
    match kind {
        "FuncCall" => check_call(node, place)?,
        "AExpr" => check_operator_expr(node)?,
        "SubLink" => {
            check_operator_name(node.get("oper_name"))?;
            unspilled::check_sublink(node)?;
        }
        "SelectStmt" => unspilled::check_set_operation(node)?,
        "JoinExpr" => unspilled::check_join(node)?,
        "RangeSubselect" => fences::check_subselect(node)?,
        "AConst" => unspilled::check_numeric_literal(node)?,
        "SortBy" => check_operator_name(node.get("use_op"))?,
        "TypeCast" => check_cast(node)?,
        "SqlvalueFunction" => check_sql_value_function(node)?,
        "ColumnRef" => {
            let fields = node.get("fields").and_then(Value::as_array).map_or(0, Vec::len);
            if fields > 2 {
                return Err(forbidden(
                    "a name of more than two parts is not allowed (PostgreSQL reads `column.f` as the call \
                     f(column)): write alias.column",
                ));
            }
        }
        "RangeFunction" => {
            // Only a call: `FROM current_user` and the like are values too.
            let calls = node.get("functions").and_then(Value::as_array);
            let all_calls = calls.into_iter().flatten().all(|call| {
                let items = call
                    .get("node")
                    .and_then(|n| n.get("List"))
                    .and_then(|l| l.get("items"));
                let first = items.and_then(Value::as_array).and_then(|i| i.first());
                first
                    .and_then(|f| f.get("node"))
                    .and_then(|n| n.get("FuncCall"))
                    .is_some()
            });
            if !all_calls {
                return Err(forbidden("only function calls may stand in FROM as functions"));
            }
            return Ok(Place::TableFunction);
        }
        // A column's type runs its input function on every value written to
        // it (a `regclass` column looks up any name it is given).
        "ColumnDef" => {
            check_column_type(node.get("type_name"))?;
            // A plain message, not a node: the walk would not see it as COLLATE.
            if node.get("coll_clause").is_some_and(|c| !c.is_null()) {
                return Err(forbidden(
                    "COLLATE on a column is not allowed: a collation changes what comparing its values costs",
                ));
            }
        }
        "Constraint" => {
            check_constraint_name(node.get("conname"))?;
            use pg_query::protobuf::ConstrType as C;
            let kind = node.get("contype").and_then(Value::as_i64).unwrap_or_default();
            if kind == C::ConstrExclusion as i64 {
                return Err(forbidden(
                    "EXCLUDE constraints are not allowed: their index methods' work on each row written is not \
                     one the statement guard can count; use UNIQUE",
                ));
            }
            // PostgreSQL 18 computes a VIRTUAL column at every read, unseen by the guard.
            if kind == C::ConstrGenerated as i64
                && node.get("generated_kind").and_then(Value::as_str) != Some("s")
            {
                return Err(forbidden(
                    "a generated column must be STORED: a virtual one runs its expression at every read",
                ));
            }
        }
        "IndexStmt" => {
            let method = node
                .get("access_method")
                .and_then(Value::as_str)
                .unwrap_or("btree");
            if !matches!(method, "" | "btree" | "hash") {
                return Err(forbidden(format!(
                    "an index USING {method} is not allowed: only btree and hash, whose work on each row \
                     written the statement guard can bound (a GIN index sorts every key of a document)"
                )));
            }
            // See `db::migrate::statistics`.
            if node.get("where_clause").is_some_and(|w| !w.is_null()) {
                return Err(forbidden(
                    "a partial index (CREATE INDEX ... WHERE) is not allowed on PostgreSQL: autovacuum's \
                     ANALYZE evaluates its predicate on every sampled row (up to 30,000), outside any \
                     deadline; index every row, or keep the rows in a table of their own",
                ));
            }
        }
        "AlterTableCmd" if node.get("subtype").and_then(Value::as_i64) == Some(AT_DROP_CONSTRAINT) => {
            check_constraint_name(node.get("name"))?
        }
        "RenameStmt" if node.get("rename_type").and_then(Value::as_i64) == Some(OBJECT_TABCONSTRAINT) => {
            check_constraint_name(node.get("subname"))?;
            check_constraint_name(node.get("newname"))?
        }
        "List" => return Ok(place),
        _ => {}
    }
    Ok(Place::Anywhere)
}

/// Words for a refused node kind that a handler's author can act on.
fn describe(kind: &str) -> String {
    let what = match kind {
        "AIndirection" | "AIndices" => {
            "field access or subscripts on an expression (PostgreSQL reads `(x).f` as the call f(x))"
        }
        "CollateClause" => "COLLATE",
        "NamedArgExpr" => "named function arguments",
        "XmlExpr" | "XmlSerialize" | "RangeTableFunc" => "XML functions",
        "GroupingSet" | "GroupingFunc" => "GROUPING SETS, CUBE and ROLLUP",
        "RangeTableSample" => "TABLESAMPLE",
        "CurrentOfExpr" => "WHERE CURRENT OF",
        "VariableSetStmt" | "VariableShowStmt" => "session settings",
        "TransactionStmt" => "transaction control",
        _ => return format!("{kind} (in PostgreSQL's reading of the statement)"),
    };
    what.to_owned()
}

/// The String nodes of a list (`{"node": {"String": {"sval": ..}}}`), in order.
fn strings(list: Option<&Value>) -> Vec<&str> {
    list.and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|item| item.get("node")?.get("String")?.get("sval")?.as_str())
                .collect()
        })
        .unwrap_or_default()
}

/// The unqualified name of a (possibly `pg_catalog.`-qualified) name, if it
/// has no other qualification.
fn catalog_name<'a>(parts: &[&'a str]) -> Option<&'a str> {
    match parts {
        [name] => Some(name),
        ["pg_catalog", name] => Some(name),
        _ => None,
    }
}

/// `pg_query::protobuf::AlterTableType::AtDropConstraint`.
const AT_DROP_CONSTRAINT: i64 = pg_query::protobuf::AlterTableType::AtDropConstraint as i64;
/// `pg_query::protobuf::ObjectType::ObjectTabconstraint`.
const OBJECT_TABCONSTRAINT: i64 = pg_query::protobuf::ObjectType::ObjectTabconstraint as i64;

/// The host keeps constraints of its own on a handler's tables (the row
/// bound, `db::migrate::bound_rows`) under its reserved names.
fn check_constraint_name(name: Option<&Value>) -> Result<(), Refusal> {
    match name.and_then(Value::as_str) {
        Some(name) if super::is_reserved(name) => Err(forbidden(format!(
            "constraint name {name} is kept for the host's own constraints (names starting with {})",
            super::RESERVED_PREFIXES.join(", ")
        ))),
        _ => Ok(()),
    }
}

fn forbidden(message: impl Into<String>) -> Refusal {
    Refusal::Forbidden(message.into())
}

#[cfg(test)]
mod tests;
