//! One pass over a parsed statement: what it reads, writes and calls, with
//! CTE names scoped as SQL scopes them. The statement guard ([`super::guard`])
//! and the migration guard ([`super::migration`]) both judge statements with it.

use super::guard::{Owned, Refusal, forbidden, name_parts};
use super::{MAX_FORMAT_BYTES, PURE_FUNCTIONS, TABLE_FUNCTIONS};
use crate::config::Backend;
use sqlparser::ast::{
    CastKind, Expr, FromTable, ObjectName, Query, Select, SetExpr, SqliteOnConflict, Statement, TableFactor,
    TableObject, Value, ValueWithSpan, Visit, Visitor,
};
use std::collections::HashSet;
use std::ops::ControlFlow;

/// Parameters are `$1` .. `$32766`; `$0`, named and bare ones are refused
/// (sqlx's SQLite driver crashed its worker on `$0`).
const MAX_PLACEHOLDER: u32 = 32_766;

/// The most common table expressions one statement may define, counting
/// every WITH in it. A chain of them (each reading the one before) is
/// expanded by SQLite's planner by recursion, with no depth bound and no
/// deadline check: 5,000 overflowed the host's stack, and the guard's own
/// scoping of them is quadratic (the seventeenth adversarial read, issue 23).
pub const MAX_CTES: usize = 32;

/// Checks one parsed SELECT, INSERT, UPDATE or DELETE: every table it reads or
/// writes is the handler's own and every function it calls is on the list.
/// Anything else is refused with the reason. Ok: the CTE names it defines.
pub fn check_dml(statement: &Statement, owned: &Owned, backend: Backend) -> Result<Vec<String>, Refusal> {
    let mut walk = Walk {
        backend: Some(backend),
        ..Walk::default()
    };
    if let ControlFlow::Break(refusal) = statement.visit(&mut walk) {
        return Err(refusal);
    }
    walk.check(owned)
}

/// Checks what a statement of another kind (a migration's DDL) reads and
/// calls: its expressions' functions, and any table it reads (a view's or a
/// `CREATE TABLE ... AS` query, a subquery in a default).
pub fn check_expressions(
    statement: &Statement,
    owned: &Owned,
    backend: Backend,
) -> Result<Vec<String>, Refusal> {
    let mut walk = Walk {
        kinds_checked: true,
        backend: Some(backend),
        ..Walk::default()
    };
    if let ControlFlow::Break(refusal) = statement.visit(&mut walk) {
        return Err(refusal);
    }
    walk.check(owned)
}

/// Why SQLite's JSON functions are refused. SQLite (3.46, the version sqlx
/// bundles) reads any BLOB argument of a JSON function or of `->` / `->>` as
/// its binary JSONB, checking only the outer header, and walks the nesting
/// by recursion with no depth bound: one nested 150 KB value overflowed the
/// host's stack (the seventeenth adversarial read, issue 23). Text JSON is
/// depth-checked, but a blob can come from a parameter or a stored column,
/// which no guard sees.
pub const SQLITE_JSON_REFUSED: &str = "SQLite's JSON functions and the -> and ->> operators are not allowed: \
     SQLite reads a BLOB argument as binary JSON and walks its nesting by recursion, with no depth bound; \
     read JSON in the handler's own code (the SDKs parse the event's payload)";

/// A call of one of SQLite's JSON functions, or its `->` / `->>`.
pub fn reads_json(expr: &Expr) -> bool {
    match expr {
        Expr::Function(function) => single_name(&function.name).is_some_and(|n| n.starts_with("json")),
        Expr::BinaryOp { op, .. } => matches!(
            op,
            sqlparser::ast::BinaryOperator::Arrow | sqlparser::ast::BinaryOperator::LongArrow
        ),
        _ => false,
    }
}

fn single_name(name: &ObjectName) -> Option<String> {
    match name_parts(name).as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

/// The common table expressions one query can see.
struct Frame {
    visible: HashSet<String>,
    /// The recursive CTE this query is the body of: its reads of its own
    /// name are the recursion's queue, not a copy of it.
    recursive_self: Option<String>,
}

/// What a statement reads, writes and calls, gathered in one pass.
///
/// CTE names are scoped as SQL scopes them: a query sees its own WITH names
/// and those of the queries around it; a CTE's body sees only the CTEs before
/// it (and itself, if the WITH is RECURSIVE). A name that no visible CTE
/// defines is a real table, whatever some other query's CTE is called.
#[derive(Default)]
struct Walk {
    relations: Vec<ObjectName>,
    write_targets: Vec<ObjectName>,
    /// Relations that are really set-returning function calls in FROM.
    table_functions: Vec<ObjectName>,
    frames: Vec<Frame>,
    /// CTE bodies not visited yet, by address, with the names visible
    /// inside and, for a recursive CTE, its own name.
    cte_bodies: Vec<(*const Query, HashSet<String>, Option<String>)>,
    /// How often each CTE name is read (a recursive CTE's reads of itself
    /// in its own body aside).
    cte_reads: std::collections::HashMap<String, usize>,
    /// Every CTE name the statement defines, in any query.
    defined: Vec<String>,
    backend: Option<Backend>,
    /// The statement kind was checked by the caller (migrations): only
    /// expressions and queries are walked.
    kinds_checked: bool,
}

impl Walk {
    fn check(self, owned: &Owned) -> Result<Vec<String>, Refusal> {
        if self.backend == Some(Backend::Sqlite)
            && let Some((name, _)) = self.cte_reads.iter().find(|(_, reads)| **reads > 1)
        {
            return Err(forbidden(format!(
                "CTE {name} is read more than once: on SQLite a statement reads each CTE at most once, \
                 since SQLite copies a CTE's query into every place that reads it while it prepares the \
                 statement, where no deadline interrupts it (CTEs each reading the one before twice made \
                 2^n copies); read it once, or join to its table directly"
            )));
        }
        for name in &self.defined {
            if super::is_reserved(name) {
                return Err(forbidden(format!(
                    "a CTE may not be named {name}: names starting with {} are the host's tables",
                    super::RESERVED_PREFIXES.join(", ")
                )));
            }
            // SQLite lets a CTE's query read every CTE of its WITH, those
            // defined after it and itself too (`searchWith`), where this walk
            // (and PostgreSQL) sees only those before it: a name that is both
            // a later CTE and an own table was taken here for the table, and
            // read twice per CTE, a chain of them made 2^n copies while SQLite
            // prepared it (issue 23, the twenty-second read: 21 CTEs, about
            // 11 s and the whole 2 GiB heap, past every deadline). A name
            // that is no own table is refused as a table anyway.
            if self.backend == Some(Backend::Sqlite) && owned.tables.contains(name) {
                return Err(forbidden(format!(
                    "a CTE may not be named like your table {name} on SQLite: SQLite lets each CTE \
                     of a WITH read every other one, those defined after it too, so which of the two \
                     a query reads depends on where it stands; rename the CTE"
                )));
            }
        }
        for target in &self.write_targets {
            owned.check(target, "write to")?;
        }
        for relation in &self.relations {
            owned.check(relation, "read")?;
        }
        Ok(self.defined)
    }

    fn visible(&self) -> HashSet<String> {
        self.frames.last().map(|f| f.visible.clone()).unwrap_or_default()
    }

    fn is_cte(&self, name: &ObjectName) -> bool {
        let visible = self.frames.last().map(|f| &f.visible);
        single_name(name).is_some_and(|n| visible.is_some_and(|v| v.contains(&n)))
    }

    /// Counts a read of CTE `name` (see [`Walk::cte_reads`]).
    fn read_cte(&mut self, name: &ObjectName) {
        let Some(name) = single_name(name) else { return };
        let own_recursion = self
            .frames
            .iter()
            .any(|f| f.recursive_self.as_deref() == Some(name.as_str()));
        if !own_recursion {
            *self.cte_reads.entry(name).or_default() += 1;
        }
    }
}

/// `TABLE name` (short for `SELECT * FROM name`) names its table outside any
/// FROM clause, so the visitor does not see it as a relation.
fn table_commands(set: &SetExpr, out: &mut Vec<Result<ObjectName, Refusal>>) {
    match set {
        SetExpr::Table(table) => match &table.table_name {
            Some(name) => {
                let mut parts = Vec::new();
                if let Some(schema) = &table.schema_name {
                    parts.push(schema.clone());
                }
                parts.push(name.clone());
                out.push(Ok(ObjectName::from(parts)));
            }
            None => out.push(Err(forbidden("TABLE without a table name is not allowed"))),
        },
        SetExpr::SetOperation { left, right, .. } => {
            table_commands(left, out);
            table_commands(right, out);
        }
        _ => {}
    }
}

fn rollback_refused() -> Refusal {
    forbidden(
        "OR ROLLBACK would roll back the host's whole transaction (the inbox claim with it): \
         use OR ABORT, OR FAIL, OR IGNORE or OR REPLACE",
    )
}

/// Why a statement kind is refused, in words a handler author can act on.
fn refuse_kind(statement: &Statement) -> Refusal {
    let text = statement.to_string();
    let words: Vec<&str> = text.split_whitespace().take(2).collect();
    let kind = words.join(" ").to_uppercase();
    let reason = match statement {
        Statement::StartTransaction { .. }
        | Statement::Commit { .. }
        | Statement::Rollback { .. }
        | Statement::Savepoint { .. }
        | Statement::ReleaseSavepoint { .. } => {
            "transaction control is the host's: your statements already run inside the event's transaction, \
             which commits with the inbox claim"
        }
        Statement::Set(_) => "session settings and role changes are not allowed",
        Statement::Copy { .. } => "COPY reads and writes server files",
        Statement::Pragma { .. } | Statement::AttachDatabase { .. } | Statement::Vacuum(_) => {
            "database-level commands are not allowed"
        }
        Statement::CreateTable(_)
        | Statement::CreateView(_)
        | Statement::CreateIndex(_)
        | Statement::CreateTrigger(_)
        | Statement::CreateFunction(_)
        | Statement::Drop { .. }
        | Statement::AlterTable(_) => "schema changes belong in the handler's migrations, not at run time",
        _ => "only SELECT, INSERT, UPDATE and DELETE are allowed",
    };
    forbidden(format!("{kind} is not allowed: {reason}"))
}

impl Visitor for Walk {
    type Break = Refusal;

    fn pre_visit_statement(&mut self, statement: &Statement) -> ControlFlow<Refusal> {
        match statement {
            Statement::Query(_) => {}
            Statement::Insert(insert) if insert.or == Some(SqliteOnConflict::Rollback) => {
                return ControlFlow::Break(rollback_refused());
            }
            Statement::Update(update) if update.or == Some(SqliteOnConflict::Rollback) => {
                return ControlFlow::Break(rollback_refused());
            }
            Statement::Insert(insert) => match &insert.table {
                TableObject::TableName(name) => self.write_targets.push(name.clone()),
                other => return ControlFlow::Break(forbidden(format!("cannot insert into {other}"))),
            },
            Statement::Update(update) => match &update.table.relation {
                TableFactor::Table { name, .. } => self.write_targets.push(name.clone()),
                other => return ControlFlow::Break(forbidden(format!("cannot update {other}"))),
            },
            Statement::Delete(delete) => {
                let from = match &delete.from {
                    FromTable::WithFromKeyword(tables) | FromTable::WithoutKeyword(tables) => tables,
                };
                if !delete.tables.is_empty() || from.len() != 1 {
                    return ControlFlow::Break(forbidden("DELETE must name exactly one table"));
                }
                match &from[0].relation {
                    TableFactor::Table { name, .. } => self.write_targets.push(name.clone()),
                    other => return ControlFlow::Break(forbidden(format!("cannot delete from {other}"))),
                }
            }
            _ if self.kinds_checked => {}
            other => return ControlFlow::Break(refuse_kind(other)),
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<Refusal> {
        let address = query as *const Query;
        let (base, recursive_self) = match self.cte_bodies.iter().position(|(q, ..)| *q == address) {
            Some(i) => {
                let (_, inside, own) = self.cte_bodies.swap_remove(i);
                (inside, own)
            }
            None => (self.visible(), None),
        };
        let mut visible = base.clone();
        if let Some(with) = &query.with {
            if self.defined.len() + with.cte_tables.len() > MAX_CTES {
                return ControlFlow::Break(forbidden(format!(
                    "a statement may define at most {MAX_CTES} common table expressions (WITH ... AS), \
                     counting every WITH in it: SQLite expands a chain of them by recursion while it \
                     prepares the statement, where no deadline interrupts it"
                )));
            }
            let names: Vec<String> = with
                .cte_tables
                .iter()
                .map(|cte| cte.alias.name.value.to_ascii_lowercase())
                .collect();
            for (i, cte) in with.cte_tables.iter().enumerate() {
                let mut inside = base.clone();
                inside.extend(names[..i].iter().cloned());
                let own = with.recursive.then(|| names[i].clone());
                inside.extend(own.clone());
                self.cte_bodies.push((&*cte.query as *const Query, inside, own));
            }
            self.defined.extend(names.iter().cloned());
            visible.extend(names);
        }
        self.frames.push(Frame {
            visible,
            recursive_self,
        });
        let mut tables = Vec::new();
        table_commands(&query.body, &mut tables);
        for table in tables {
            match table {
                Ok(name) if !self.is_cte(&name) => self.relations.push(name),
                Ok(name) => self.read_cte(&name),
                Err(refusal) => return ControlFlow::Break(refusal),
            }
        }
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, _query: &Query) -> ControlFlow<Refusal> {
        self.frames.pop();
        ControlFlow::Continue(())
    }

    fn pre_visit_select(&mut self, select: &Select) -> ControlFlow<Refusal> {
        if select.into.is_some() {
            return ControlFlow::Break(forbidden(
                "SELECT ... INTO creates a table: schema changes belong in the handler's migrations",
            ));
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_relation(&mut self, relation: &ObjectName) -> ControlFlow<Refusal> {
        if self.table_functions.iter().any(|f| f == relation) {
            return ControlFlow::Continue(());
        }
        if self.is_cte(relation) {
            self.read_cte(relation);
        } else {
            self.relations.push(relation.clone());
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_table_factor(&mut self, factor: &TableFactor) -> ControlFlow<Refusal> {
        match factor {
            TableFactor::Table {
                name, args: Some(_), ..
            }
            | TableFactor::Function { name, .. } => {
                if self.backend == Some(Backend::Sqlite)
                    && single_name(name).is_some_and(|n| n.starts_with("json"))
                {
                    return ControlFlow::Break(forbidden(SQLITE_JSON_REFUSED));
                }
                let allowed = single_name(name).is_some_and(|n| TABLE_FUNCTIONS.contains(&n.as_str()));
                if !allowed {
                    return ControlFlow::Break(forbidden(format!(
                        "function {name} is not on the allowlist of table functions ({})",
                        TABLE_FUNCTIONS.join(", ")
                    )));
                }
                self.table_functions.push(name.clone());
            }
            TableFactor::TableFunction { .. } => {
                return ControlFlow::Break(forbidden("TABLE(...) functions are not allowed"));
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_value(&mut self, value: &ValueWithSpan) -> ControlFlow<Refusal> {
        if let Value::Placeholder(p) = &value.value {
            let number = p
                .strip_prefix('$')
                .filter(|n| !n.starts_with('0'))
                .and_then(|n| n.parse::<u32>().ok());
            if !number.is_some_and(|n| (1..=MAX_PLACEHOLDER).contains(&n)) {
                return ControlFlow::Break(forbidden(format!(
                    "parameter {p} is not allowed: number parameters $1, $2, ... (at most ${MAX_PLACEHOLDER})"
                )));
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<Refusal> {
        // SQLite has no `::` cast: it reads `$1::x(...)` as one parameter
        // name, hiding from the guard what the parser took for a cast.
        if let Expr::Cast {
            kind: CastKind::DoubleColon,
            ..
        } = expr
            && self.backend == Some(Backend::Sqlite)
        {
            return ControlFlow::Break(forbidden(
                "`::` casts are PostgreSQL's: on SQLite write CAST(x AS type)",
            ));
        }
        if self.backend == Some(Backend::Sqlite) && reads_json(expr) {
            return ControlFlow::Break(forbidden(SQLITE_JSON_REFUSED));
        }
        if let Err(refusal) = check_expr_kind(expr) {
            return ControlFlow::Break(refusal);
        }
        if let Expr::Function(function) = expr {
            let allowed = single_name(&function.name).is_some_and(|n| PURE_FUNCTIONS.contains(&n.as_str()));
            if !allowed {
                return ControlFlow::Break(forbidden(format!(
                    "function {} is not allowed: handlers may call only pure functions on their own rows \
                     (set_config, file, large-object, extension, remote and padding functions are refused)",
                    function.name
                )));
            }
            if single_name(&function.name).as_deref() == Some("strftime") && !short_literal_first(function) {
                return ControlFlow::Break(forbidden(format!(
                    "strftime(format, ...) is not allowed with anything but a literal format of at most \
                     {MAX_FORMAT_BYTES} bytes: over a long format one call is one step of tens of milliseconds, \
                     which no deadline interrupts"
                )));
            }
            if single_name(&function.name).as_deref() == Some("json_extract") && argument_count(function) > 2
            {
                return ControlFlow::Break(forbidden(
                    "json_extract(j, path, path, ...) is not allowed: with many paths it is one step of \
                     tens of milliseconds over a large document, which no deadline interrupts; extract one \
                     path per call",
                ));
            }
            if SINGLE_ARGUMENT.contains(&single_name(&function.name).unwrap_or_default().as_str())
                && argument_count(function) > 1
            {
                return ControlFlow::Break(forbidden(format!(
                    "{}(x, characters) is not allowed: its time grows with both lengths and one call \
                     cannot be interrupted at the event's deadline; use {}(x)",
                    function.name, function.name
                )));
            }
        }
        ControlFlow::Continue(())
    }
}

/// Functions allowed with one argument only: with a second (the characters
/// to trim) each is one step whose time grows with both lengths, which
/// neither database interrupts at a deadline.
const SINGLE_ARGUMENT: &[&str] = &["trim", "ltrim", "rtrim"];

/// True if the call's first argument is a string literal of at most
/// [`MAX_FORMAT_BYTES`].
fn short_literal_first(function: &sqlparser::ast::Function) -> bool {
    use sqlparser::ast::{FunctionArg, FunctionArgExpr, FunctionArguments, Value};
    let FunctionArguments::List(list) = &function.args else {
        return false;
    };
    match list.args.first() {
        Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(v)))) => {
            matches!(&v.value, Value::SingleQuotedString(f) if f.len() <= MAX_FORMAT_BYTES)
        }
        _ => false,
    }
}

fn argument_count(function: &sqlparser::ast::Function) -> usize {
    match &function.args {
        sqlparser::ast::FunctionArguments::List(list) => list.args.len(),
        _ => 0,
    }
}

/// The kinds of expression a handler may write: an allowlist, because
/// PostgreSQL turns syntax that looks like no call into function calls
/// (attribute notation `(x).f` and `a.b.f` are `f(x)`, `COLLATE`,
/// `AT TIME ZONE`, `POSITION(a IN b)` and subscripts each run a function, a
/// cast runs the type's input function) and a parser that is not the
/// database's may read such syntax as something harmless. Every kind not
/// named here is refused with its name. Casts and typed literals are held
/// to [`CAST_TYPES`]. The database's own privileges stand behind this: on
/// PostgreSQL the session is the handler's own login (see `db::logins`).
fn check_expr_kind(expr: &Expr) -> Result<(), Refusal> {
    let kind = match expr {
        Expr::Identifier(_)
        | Expr::IsFalse(_)
        | Expr::IsNotFalse(_)
        | Expr::IsTrue(_)
        | Expr::IsNotTrue(_)
        | Expr::IsNull(_)
        | Expr::IsNotNull(_)
        | Expr::IsUnknown(_)
        | Expr::IsNotUnknown(_)
        | Expr::IsDistinctFrom(..)
        | Expr::IsNotDistinctFrom(..)
        | Expr::In { .. }
        | Expr::Between { .. }
        | Expr::AnyOp { .. }
        | Expr::AllOp { .. }
        | Expr::UnaryOp { .. }
        | Expr::Extract { .. }
        | Expr::Ceil { .. }
        | Expr::Floor { .. }
        | Expr::Substring { .. }
        | Expr::Nested(_)
        | Expr::Value(_)
        | Expr::Function(_)
        | Expr::Case { .. }
        | Expr::Exists { .. }
        | Expr::Subquery(_)
        | Expr::Tuple(_)
        | Expr::Array(_)
        | Expr::Interval(_)
        | Expr::Wildcard(_)
        | Expr::QualifiedWildcard(..) => return Ok(()),
        // `a.b` is a column of a table; on PostgreSQL three parts can be
        // `column.function`, so at most two (on SQLite too, alike).
        Expr::CompoundIdentifier(parts) => {
            if parts.len() <= 2 {
                return Ok(());
            }
            "a name of more than two parts (PostgreSQL reads `column.f` as the call f(column)): write              alias.column"
        }
        Expr::BinaryOp { op, .. } => {
            if operator_allowed(op) {
                return Ok(());
            }
            return Err(forbidden(format!(
                "operator {op} is not allowed: handlers may use comparison, arithmetic, bitwise, \
                 concatenation, LIKE and JSON field operators (not containment, overlap or regular \
                 expressions, whose one call no deadline interrupts)"
            )));
        }
        Expr::Cast { data_type, .. } => return check_type(data_type, "cast to"),
        Expr::TypedString(typed) => return check_type(&typed.data_type, "literal of type"),
        // Without characters to trim: linear in the text.
        Expr::Trim {
            trim_what: None,
            trim_characters: None,
            ..
        } => return Ok(()),
        Expr::Trim { .. } => {
            "TRIM(... FROM x) with characters to trim (its time grows with both lengths and one call \
             cannot be interrupted at the event's deadline)"
        }
        Expr::CompoundFieldAccess { .. } => {
            "field access or subscripts on an expression (PostgreSQL reads `(x).f` as the call f(x))"
        }
        Expr::Position { .. } => {
            "POSITION(a IN b) (its time grows with both lengths and PostgreSQL does not interrupt it at \
             the event's deadline)"
        }
        Expr::Collate { .. } => "COLLATE",
        Expr::AtTimeZone { .. } => "AT TIME ZONE",
        Expr::SimilarTo { .. } | Expr::RLike { .. } => "regular expressions",
        Expr::Like { .. } | Expr::ILike { .. } => {
            "LIKE and ILIKE (one call's time grows with both the text's and the pattern's length, and \
             neither database interrupts it at the event's deadline): compare left(x, n) = $1, \
             right(x, n) = $1 or lower(x) = $1, or match in the handler's code"
        }
        Expr::Overlay { .. } => "OVERLAY",
        Expr::Convert { .. } => "CONVERT",
        Expr::GroupingSets(_) | Expr::Cube(_) | Expr::Rollup(_) => "GROUPING SETS, CUBE and ROLLUP",
        _ => "this kind of expression",
    };
    Err(forbidden(format!(
        "{kind} is not allowed: handlers may write only plain expressions over their own rows \
         (columns, literals, parameters, operators, CASE, subqueries and the allowed functions)"
    )))
}

/// The binary operators a handler may use (see `super::postgres::OPERATORS`,
/// the same list as PostgreSQL names them): each costs time linear in its
/// operands. Not here: array and JSON containment and overlap, regular
/// expressions, text search and the other dialects' operators.
fn operator_allowed(op: &sqlparser::ast::BinaryOperator) -> bool {
    use sqlparser::ast::BinaryOperator as B;
    matches!(
        op,
        B::Plus
            | B::Minus
            | B::Multiply
            | B::Divide
            | B::Modulo
            | B::StringConcat
            | B::Gt
            | B::Lt
            | B::GtEq
            | B::LtEq
            | B::Eq
            | B::NotEq
            | B::And
            | B::Or
            | B::BitwiseOr
            | B::BitwiseAnd
            | B::BitwiseXor
            | B::PGBitwiseXor
            | B::PGBitwiseShiftLeft
            | B::PGBitwiseShiftRight
            | B::PGExp
            | B::Arrow
            | B::LongArrow
            | B::HashArrow
            | B::HashLongArrow
            | B::Question
            | B::Is
            | B::IsNot
    )
}

/// Types a cast or a typed literal may name (lower case, without arguments
/// or array brackets): each one's input function only parses its own text.
/// Not here: `reg*` (names looked up in the catalog), `xml`, text search,
/// geometric, network and range types, and any type of the handler's own.
pub const CAST_TYPES: &[&str] = &[
    "bigint",
    "blob",
    "bool",
    "boolean",
    "bytea",
    "char",
    "character",
    "character varying",
    "date",
    "dec",
    "decimal",
    "double",
    "double precision",
    "float",
    "float4",
    "float8",
    "int",
    "int2",
    "int4",
    "int8",
    "integer",
    "interval",
    "json",
    "jsonb",
    "numeric",
    "real",
    "smallint",
    "text",
    "time",
    "timestamp",
    "timestamp with time zone",
    "timestamp without time zone",
    "timestamptz",
    "uuid",
    "varchar",
];

fn check_type(data_type: &sqlparser::ast::DataType, what: &str) -> Result<(), Refusal> {
    let text = data_type.to_string().to_ascii_lowercase();
    let mut base = text.trim_end_matches("[]").trim();
    if let Some(open) = base.find('(') {
        // A `)` before the `(` (a quoted name, `"a)b(c"`) is no argument list.
        let close = base.rfind(')').filter(|c| *c > open).unwrap_or(base.len());
        // `varchar(10)`, `numeric(10, 2)`, `timestamp(3) with time zone`.
        let args_ok = base[open + 1..close]
            .chars()
            .all(|c| c.is_ascii_digit() || c == ',' || c == ' ');
        if !args_ok {
            return Err(forbidden(format!("a {what} {text} is not allowed")));
        }
        let (head, tail) = (&base[..open], &base[(close + 1).min(base.len())..]);
        let joined = format!("{} {}", head.trim(), tail.trim());
        return check_type_name(joined.trim(), &text, what);
    }
    base = base.trim();
    check_type_name(base, &text, what)
}

fn check_type_name(name: &str, text: &str, what: &str) -> Result<(), Refusal> {
    if CAST_TYPES.contains(&name) {
        return Ok(());
    }
    Err(forbidden(format!(
        "a {what} {text} is not allowed: casts may name only plain types ({})",
        CAST_TYPES.join(", ")
    )))
}
