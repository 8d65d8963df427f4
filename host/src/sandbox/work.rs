//! The work PostgreSQL may do on one row of a handler's statement without
//! looking at the deadline, bounded before the statement runs.
//!
//! PostgreSQL acts on a cancel (`statement_timeout`, `pg_cancel_backend`, even
//! `pg_terminate_backend`) only at its interrupt checks, which fall between
//! rows, not inside the evaluation of one row's expressions. So a statement
//! that calls `md5(v)` a thousand times over a large `v` runs past every
//! deadline (an adversarial read, issue 23). This module bounds that work:
//! every call, operator and cast costs its measured time per byte of input
//! ([`LIGHT`], [`HEAVY`]), and numeric multiplication and division cost per
//! pair of digit groups ([`DIGIT_PAIR`]), over sizes that the limits bound:
//!
//! - a column, a whole row or `*` is at most `limits.max_row_bytes` as text:
//!   the host holds every table of a handler to it with a `CHECK` on the whole
//!   row (`db::migrate::bound_rows`); a bound parameter is held to it by the
//!   SQL capability;
//! - a value a subquery or CTE computes is bounded by its expression, and the
//!   bound is carried to every reference of a derived column until it is
//!   stable (a recursive CTE whose values grow never is, and is refused);
//! - a numeric column has at most 1,000 digits: a migration must say
//!   `numeric(p, s)`, and a cast to numeric must too (`sandbox::postgres`);
//! - an array may stand only where its elements are visited once each
//!   (`unnest(...)`, `= ANY(...)`), so no operator meets one (`jsonb - text[]`
//!   is a nested loop over both).
//!
//! The planner merges subqueries and CTEs into the query that reads them,
//! copying a derived column's expression to every place it is named, and a
//! table's CHECK, DEFAULT, generated and index expressions run inside every
//! write (an adversarial read, issue 23). So the work counted is the whole
//! statement's (one row of VALUES at a time), a reference to a derived
//! column costs that column's expression again, and a write adds its table's
//! expressions (`Guard`'s `hidden` work, read from the catalog at load). It
//! must stay within [`ROW_WORK_NS`], and no value may grow past
//! [`VALUE_ROWS`] rows' worth: a statement past either is refused with the
//! bound named. The weights are this
//! machine's measured costs with a margin (`tests::every_function_at_the_limits`
//! in `db::walls` checks them on a real server); what is not per row (a sort's
//! comparisons) is bounded by the session's `work_mem`.

use super::guard::Refusal;
use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// One row's uninterruptible work may take this long, by the weights below.
pub const ROW_WORK_NS: u64 = 1_000_000_000;

/// No value a statement builds may be larger than this many rows at the
/// bound: it is held in the backend's memory (and the host's, if returned)
/// before any limit looks at it.
pub const VALUE_ROWS: u64 = 64;

/// A view's columns together may be this many rows at the bound (a whole
/// row of a table is one, by the host's constraint; of a view, this many).
pub const VIEW_ROWS: u64 = 4;

/// Nanoseconds per byte of input of the cheap calls, operators and casts:
/// `=`, `<>`, arithmetic, `md5`, `length`, `substr`, `trim`, `left`, `right`,
/// casts to anything but JSON (measured at most 6 ns per byte on 6 MiB values).
const LIGHT: u64 = 12;
/// Nanoseconds per byte of collation-aware work: `<` and kin, `upper`,
/// `lower`, `concat` (measured at most 12 ns per byte, with an ICU collation).
const COLLATED: u64 = 32;
/// Nanoseconds per byte of everything else: JSON parsing (`->>` on text,
/// casts to json and jsonb), `||` (on jsonb: measured 34 ns per byte), casts
/// to floating point (39), `to_char` and `to_timestamp` formats (53).
const HEAVY: u64 = 64;
/// Nanoseconds per pair of base-10,000 digit groups of a numeric
/// multiplication, division or remainder (measured 1.5).
const DIGIT_PAIR: u64 = 3;

/// Digits of a number from a column: `numeric(p, s)` has p <= 1000.
pub const COLUMN_DIGITS: u64 = 1_000;
/// Digits of an integer or floating-point value.
const NUMBER_DIGITS: u64 = 20;
/// PostgreSQL's own bound on a numeric's digits (131,072 before the point,
/// 16,383 after).
const MAX_DIGITS: u64 = 147_455;

/// Calls that cost [`LIGHT`] per byte.
const LIGHT_CALLS: &[&str] = &[
    "abs",
    "avg",
    "btrim",
    "ceil",
    "ceiling",
    "char_length",
    "coalesce",
    "count",
    "floor",
    "gen_random_uuid",
    "left",
    "length",
    "ltrim",
    "md5",
    "mod",
    "nullif",
    "right",
    "round",
    "rtrim",
    "sign",
    "sqrt",
    "substr",
    "substring",
    "sum",
    "trim",
    "trunc",
];
/// Calls that cost [`COLLATED`] per byte.
const COLLATED_CALLS: &[&str] = &[
    "concat",
    "concat_ws",
    "date_part",
    "date_trunc",
    "extract",
    "greatest",
    "least",
    "lower",
    "max",
    "min",
    "upper",
];
/// Operators that cost [`LIGHT`] per byte.
const LIGHT_OPERATORS: &[&str] = &["=", "<>", "+", "-", "*", "/", "%", "&", "|", "#", "<<", ">>", "?"];
/// Operators that cost [`COLLATED`] per byte.
const COLLATED_OPERATORS: &[&str] = &["<", ">", "<=", ">="];
/// Calls whose result can be as long as all their arguments together.
const CONCATENATING: &[&str] = &["concat", "concat_ws"];
/// Calls that write their arguments as JSON: an escaped character takes up
/// to six bytes (`\u0001`).
const JSON_BUILDING: &[&str] = &[
    "json_array",
    "json_build_array",
    "json_build_object",
    "json_object",
    "jsonb_build_array",
    "jsonb_build_object",
];

/// Upper bounds of one value: bytes as text, and digits if it is a number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Size {
    bytes: u64,
    digits: u64,
}

impl Size {
    const SMALL: Size = Size {
        bytes: 32,
        digits: NUMBER_DIGITS,
    };

    fn max(self, other: Size) -> Size {
        Size {
            bytes: self.bytes.max(other.bytes),
            digits: self.digits.max(other.digits),
        }
    }
}

/// Checks the work of one row of the statement `tree` (PostgreSQL's parse
/// tree as JSON), with every stored row and bound value at most `row_bytes`;
/// `hidden`: the work its tables' own expressions add to a write (see the
/// module docs).
pub fn check(tree: &Value, row_bytes: u64, hidden: u64) -> Result<(), Refusal> {
    let ns = row_work_ns(tree, row_bytes, hidden)?;
    if ns > ROW_WORK_NS {
        return Err(too_much(ns, row_bytes));
    }
    Ok(())
}

/// What a column reference may stand for: a stored value, or the
/// expression of a derived column (which the planner may copy in).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Derived {
    bytes: u64,
    digits: u64,
    /// Work of evaluating the expression once.
    work: u64,
    /// A whole row of a derived table (`s`, `s.*`, `*`): all its columns.
    row: u64,
    /// The work of all its columns' expressions.
    row_work: u64,
}

/// The most work, in nanoseconds by the weights, that one row of the
/// statement may take.
pub fn row_work_ns(tree: &Value, row_bytes: u64, hidden: u64) -> Result<u64, Refusal> {
    let stored = Derived {
        bytes: row_bytes,
        digits: COLUMN_DIGITS,
        work: 0,
        row: VIEW_ROWS * row_bytes,
        row_work: 0,
    };
    let (mut columns, mut derived, mut star) = (Columns::new(), stored, false);
    // A column renamed where it is read (`FROM l AS p(w)`, a join's alias
    // list) has a name no output had.
    let renamed = renamed_on_reading(tree);
    let mut unnamed = renamed;
    // Each round carries what a subquery, CTE or function in FROM outputs,
    // by column name, to the references of that name. A chain of n queries
    // is carried whole after n + 1 rounds; a CTE that reads itself can be a
    // chain of any length, so there the bound must also be stable.
    let queries = count_queries(tree);
    let recursive = has_recursion(tree);
    for round in 0..=queries + 1 {
        let mut walk = Walk {
            row_bytes,
            stored,
            columns: columns.clone(),
            derived,
            star,
            unnamed,
            inner: stored,
            names: names(tree).0,
            relations: names(tree).1,
            ..Walk::default()
        };
        let written = walk.visit(tree)?;
        // A write past the row bound runs its table's expressions on the
        // larger values before the bound refuses the row.
        let scale = written.bytes.div_ceil(row_bytes.max(1)).max(1);
        let work = walk.work.saturating_add(hidden.saturating_mul(scale));
        if work > ROW_WORK_NS {
            return Ok(work);
        }
        let found_unnamed = walk.found_unnamed || renamed;
        let stable = walk.found == columns
            && walk.inner == derived
            && walk.found_star == star
            && found_unnamed == unnamed;
        if stable || (!recursive && round == queries + 1) {
            return Ok(work);
        }
        (columns, derived, star, unnamed) = (walk.found, walk.inner, walk.found_star, found_unnamed);
    }
    Err(Refusal::Limit(format!(
        "a subquery or CTE of this statement builds values that grow without a bound PostgreSQL would \
         interrupt (concatenation in a recursive CTE, or repeated through derived tables); the statement \
         guard counts every value at up to limits.max_row_bytes ({row_bytes} bytes): build the value in \
         steps, one statement each"
    )))
}

/// Derived columns by name.
type Columns = std::collections::BTreeMap<String, Derived>;

/// Whether a table, CTE or join is given column names where it is read.
fn renamed_on_reading(tree: &Value) -> bool {
    let mut stack = vec![tree];
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                let renames = |n: &Map<String, Value>| {
                    n.get("alias")
                        .and_then(|a| a.get("colnames"))
                        .and_then(Value::as_array)
                        .is_some_and(|c| !c.is_empty())
                };
                let joined = matches!(node(fields), Some(("JoinExpr", n)) if renames(n));
                if joined || (fields.contains_key("relname") && renames(fields)) {
                    return true;
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    false
}

/// Whether a CTE of the statement reads itself.
fn has_recursion(tree: &Value) -> bool {
    let mut stack = vec![tree];
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                if let Some(("CommonTableExpr", n)) = node(fields)
                    && let Some(name) = n.get("ctename").and_then(Value::as_str)
                    && reads_table(n.get("ctequery"), name)
                {
                    return true;
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    false
}

/// Checks a view's query: PostgreSQL runs a view's output expressions
/// inside the statements that read it (where several views' add up in one
/// row, unseen by [`check`]), so a view may only select and rename columns.
/// Its filters and joins run in nodes of their own, row by row, and are
/// held to [`check`]'s bound.
pub fn check_view(tree: &Value, row_bytes: u64) -> Result<(), Refusal> {
    let mut stack = vec![tree];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                if let Some(targets) = fields.get("target_list") {
                    let stored = Derived {
                        bytes: row_bytes,
                        digits: COLUMN_DIGITS,
                        work: 0,
                        row: VIEW_ROWS * row_bytes,
                        row_work: 0,
                    };
                    let mut walk = Walk {
                        row_bytes,
                        stored,
                        derived: stored,
                        inner: stored,
                        ..Walk::default()
                    };
                    for target in targets.as_array().into_iter().flatten() {
                        if !star_target(target) {
                            walk.visit(target)?;
                        }
                    }
                    if walk.work > 0 {
                        return Err(Refusal::Forbidden(
                            "a view on PostgreSQL may only select and rename columns (no calls, operators \
                             or casts in its SELECT list): PostgreSQL runs those expressions inside the \
                             statements that read the view, where the statement guard cannot count their \
                             work; compute them in the handler's statements"
                                .into(),
                        ));
                    }
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    check(tree, row_bytes, 0)
}

fn too_much(ns: u64, row_bytes: u64) -> Refusal {
    Refusal::Limit(format!(
        "this statement may work up to {} ms on one row, which PostgreSQL does not interrupt at the \
         event's deadline (the bound is {} ms, counting every column and parameter at up to \
         limits.max_row_bytes = {row_bytes} bytes and every numeric column at {COLUMN_DIGITS} digits): \
         split it into smaller statements, or lower limits.max_row_bytes",
        ns / 1_000_000,
        ROW_WORK_NS / 1_000_000
    ))
}

fn count_queries(value: &Value) -> u64 {
    let mut stack = vec![value];
    let mut n = 0;
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                n += u64::from(fields.contains_key("target_list") || fields.contains_key("values_lists"));
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    n
}

#[derive(Default)]
struct Walk {
    row_bytes: u64,
    /// A stored value: what a column reference stands for unless a derived
    /// column has its name.
    stored: Derived,
    /// Derived columns by name, from the last round.
    columns: Columns,
    /// The same, gathered this round.
    found: Columns,
    /// The largest of all derived values, last round: what an unknown name
    /// stands for when a derived query passes `*` through.
    derived: Derived,
    /// A derived query had `*` (last round; this round).
    star: bool,
    found_star: bool,
    /// A derived query had an output this walk cannot name as PostgreSQL
    /// does (`?column?`, `case`, ...), or a column is renamed where it is
    /// read (last round; this round): an unknown name may be any derived value.
    unnamed: bool,
    found_unnamed: bool,
    /// Work counted so far (one row of VALUES at a time).
    work: u64,
    /// Nesting of subqueries and CTEs around the node being visited.
    depth: u32,
    /// Inside the body of a CTE that reads itself: PostgreSQL materializes
    /// it (a worktable), so its expressions are not copied into readers.
    recursive: u32,
    /// The largest value, digits and costliest expression a nested query
    /// or function in FROM outputs (at least a stored value's).
    inner: Derived,
    /// The next node may be an array: it is the argument of a function in
    /// FROM, or the array of `= ANY (...)`.
    array_ok: bool,
    /// The next call is a function in FROM.
    from_function: bool,
    /// Names a bare column reference may take for a whole row: tables,
    /// aliases, CTEs and functions in FROM.
    names: BTreeSet<String>,
    /// Tables, views and their aliases, whose bare names may be whole rows.
    relations: BTreeSet<String>,
}

impl Walk {
    fn charge(&mut self, ns: u64) {
        self.work = self.work.saturating_add(ns);
    }

    /// Records what a nested query's output column (or a FROM function's)
    /// can be: `work` is what evaluating it once cost.
    /// ... under `name`, if it has one.
    fn named(&mut self, name: Option<&str>, size: Size, work: u64) {
        self.output(size, work);
        let work = if self.recursive > 0 { 0 } else { work };
        if name.is_none() && self.depth > 0 {
            self.found_unnamed = true;
        }
        if let Some(name) = name {
            let entry = self.found.entry(name.to_owned()).or_default();
            *entry = Derived {
                bytes: entry.bytes.max(size.bytes),
                digits: entry.digits.max(size.digits),
                work: entry.work.max(work),
                row: 0,
                row_work: 0,
            };
        }
    }

    fn output(&mut self, size: Size, work: u64) {
        let work = if self.recursive > 0 { 0 } else { work };
        self.inner = Derived {
            bytes: self.inner.bytes.max(size.bytes),
            digits: self.inner.digits.max(size.digits),
            work: self.inner.work.max(work),
            ..self.inner
        };
    }

    /// Records a nested query's whole output row: `bytes` and `work` of all
    /// its columns together. Any query's row is held to the value cap.
    fn output_row(&mut self, bytes: u64, work: u64) -> Result<(), Refusal> {
        self.cap(bytes, "a row")?;
        if self.depth > 0 {
            let work = if self.recursive > 0 { 0 } else { work };
            self.inner.row = self.inner.row.max(bytes);
            self.inner.row_work = self.inner.row_work.max(work);
        }
        Ok(())
    }

    fn cap(&self, bytes: u64, what: &str) -> Result<(), Refusal> {
        let cap = self.row_bytes.saturating_mul(VALUE_ROWS);
        if bytes > cap {
            return Err(Refusal::Limit(format!(
                "this statement may build {what} of up to {} MiB, more than {VALUE_ROWS} rows at \
                 limits.max_row_bytes ({} bytes): PostgreSQL holds it in memory and works on it without \
                 interruption; build it in smaller steps",
                bytes >> 20,
                self.row_bytes
            )));
        }
        Ok(())
    }

    /// Visits anything: a node, a list or a plain message.
    fn visit(&mut self, value: &Value) -> Result<Size, Refusal> {
        match value {
            Value::Array(items) => {
                let mut size = Size::default();
                for item in items {
                    size = size.max(self.visit(item)?);
                }
                Ok(size)
            }
            Value::Object(fields) => match node(fields) {
                Some((kind, inner)) => self.node(kind, inner),
                None => self.fields(fields),
            },
            _ => Ok(Size::default()),
        }
    }

    fn fields(&mut self, fields: &Map<String, Value>) -> Result<Size, Refusal> {
        if fields.contains_key("target_list") || fields.contains_key("values_lists") {
            return self.query(fields);
        }
        // PostgreSQL 18's RETURNING (a plain message: `options`, `exprs`).
        if let (Some(exprs), true) = (fields.get("exprs"), fields.contains_key("options")) {
            return self.targets(exprs);
        }
        let mut size = Size::default();
        for value in fields.values() {
            size = size.max(self.visit(value)?);
        }
        Ok(size)
    }

    fn field(&mut self, fields: &Map<String, Value>, name: &str) -> Result<Size, Refusal> {
        fields.get(name).map_or(Ok(Size::default()), |v| self.visit(v))
    }

    /// A list field's items, each sized.
    fn items(&mut self, fields: &Map<String, Value>, name: &str) -> Result<Vec<Size>, Refusal> {
        match fields.get(name) {
            Some(Value::Array(items)) => items.iter().map(|item| self.visit(item)).collect(),
            Some(other) => Ok(vec![self.visit(other)?]),
            None => Ok(Vec::new()),
        }
    }

    /// A SELECT (or UPDATE, or ON CONFLICT DO UPDATE): its work counts in
    /// full, except that of VALUES, whose rows count one at a time; returns
    /// its largest output value. Inside a subquery or CTE, each output column
    /// is recorded with the work of its expression (see [`Walk::output`]).
    fn query(&mut self, fields: &Map<String, Value>) -> Result<Size, Refusal> {
        let mut output = Size::default();
        for (name, value) in fields {
            match name.as_str() {
                "target_list" | "returning_list" => output = output.max(self.targets(value)?),
                "values_lists" => {
                    let (before, mut widest) = (self.work, 0);
                    for values in value.as_array().into_iter().flatten() {
                        self.work = before;
                        let mut row = 0u64;
                        for item in values
                            .pointer("/node/List/items")
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten()
                        {
                            let start = self.work;
                            let size = self.visit(item)?;
                            output = output.max(size);
                            row = row.saturating_add(size.bytes);
                            if self.depth > 0 {
                                self.output(size, self.work - start);
                            }
                        }
                        self.output_row(row, self.work - before)?;
                        widest = widest.max(self.work - before);
                    }
                    self.work = before.saturating_add(widest);
                }
                // A UNION's arms: the columns are either's.
                "larg" | "rarg" => output = output.max(self.visit(value)?),
                _ => {
                    self.visit(value)?;
                }
            }
        }
        Ok(output)
    }

    /// A SELECT or RETURNING list: its largest item; its whole row is held
    /// to the cap and, inside a subquery or CTE, recorded for its readers.
    fn targets(&mut self, value: &Value) -> Result<Size, Refusal> {
        let mut output = Size::default();
        let (start, mut row) = (self.work, 0u64);
        for target in value.as_array().into_iter().flatten() {
            let before = self.work;
            let size = match star_target(target) {
                // `*` and `x.*` stand for their columns (PostgreSQL
                // expands them), each a stored or derived value.
                true => {
                    self.found_star |= self.depth > 0;
                    let row = if self.star {
                        self.derived.row
                    } else {
                        self.stored.row
                    };
                    self.charge(self.derived.row_work);
                    Size {
                        bytes: row.max(self.derived.row),
                        digits: self.derived.digits,
                    }
                }
                false => self.visit(target)?,
            };
            output = output.max(size);
            row = row.saturating_add(size.bytes);
            if self.depth > 0 {
                self.named(target_name(target), size, self.work - before);
            }
        }
        self.output_row(row, self.work - start)?;
        Ok(output)
    }

    fn nested(&mut self, value: Option<&Value>) -> Result<Size, Refusal> {
        self.depth += 1;
        let size = value.map_or(Ok(Size::default()), |v| self.visit(v));
        self.depth -= 1;
        size
    }

    fn node(&mut self, kind: &str, n: &Map<String, Value>) -> Result<Size, Refusal> {
        if !std::mem::take(&mut self.array_ok) && is_array(kind, n) {
            return Err(Refusal::Forbidden(
                "an array is allowed only as the argument of a function in FROM (unnest(...)) and in \
                 = ANY (...) / <> ALL (...): anywhere else it can reach an operator that loops over both \
                 sides (jsonb - text[]), which PostgreSQL does not interrupt"
                    .into(),
            ));
        }
        let from_function = std::mem::take(&mut self.from_function);
        let size = self.sized(kind, n, from_function)?;
        self.cap(size.bytes, "a value")?;
        Ok(size)
    }

    fn sized(&mut self, kind: &str, n: &Map<String, Value>, from_function: bool) -> Result<Size, Refusal> {
        Ok(match kind {
            "ColumnRef" | "AStar" => {
                if kind == "AStar" || self.is_row_ref(n) {
                    return Err(Refusal::Forbidden(
                        "a whole row (`t`, `t.*`) may stand only as an item of a SELECT or RETURNING list, \
                         not inside an expression: a row of a view or derived table is many values at once, \
                         which PostgreSQL then works on without interruption; name the columns"
                            .into(),
                    ));
                }
                // A derived column of its name, whose expression the planner
                // may copy here; else a stored value (or, past a derived `*`,
                // any derived value).
                let name = last_name(n.get("fields"));
                let relation = name.is_some_and(|name| self.relations.contains(name));
                // At least a stored value: the name may also be a table's column.
                let at_least = |c: Derived| Derived {
                    bytes: c.bytes.max(self.stored.bytes),
                    digits: c.digits.max(self.stored.digits),
                    ..c
                };
                let column = match name.and_then(|name| self.columns.get(name)) {
                    Some(column) => at_least(*column),
                    None if self.star || self.unnamed => at_least(self.derived),
                    None => self.stored,
                };
                self.charge(column.work);
                // A bare table or view name may be its whole row.
                let bytes = if relation && fields_len(n) == 1 {
                    column.bytes.max(column.row)
                } else {
                    column.bytes
                };
                Size {
                    bytes,
                    digits: column.digits,
                }
            }
            "ParamRef" => Size {
                bytes: self.row_bytes,
                digits: NUMBER_DIGITS,
            },
            "AConst" => literal(n),
            "TypeCast" => {
                let arg = self.field(n, "arg")?;
                let (size, weight) = cast(n.get("type_name"), arg)?;
                self.charge(weight.saturating_mul(arg.bytes));
                size
            }
            "FuncCall" => self.call(n, from_function)?,
            "RangeFunction" => {
                for (name, value) in n {
                    if name == "functions" {
                        // Each is a List of the call and its column definitions.
                        for list in value.as_array().into_iter().flatten() {
                            let items = list.pointer("/node/List/items").and_then(Value::as_array);
                            for (i, item) in items.into_iter().flatten().enumerate() {
                                self.from_function = i == 0;
                                let before = self.work;
                                let size = self.visit(item)?;
                                // Its columns are no larger than its arguments.
                                if i == 0 {
                                    let work = self.work - before;
                                    let alias = n.get("alias");
                                    let mut named: Vec<&str> =
                                        strings_of(alias.and_then(|a| a.get("colnames")));
                                    named.extend(
                                        alias.and_then(|a| a.get("aliasname")).and_then(Value::as_str),
                                    );
                                    named.extend(last_name(item.pointer("/node/FuncCall/funcname")));
                                    for column in named {
                                        self.named(Some(column), size, work);
                                    }
                                    self.output(size, work);
                                }
                            }
                        }
                    } else {
                        self.visit(value)?;
                    }
                }
                Size::default()
            }
            "AExpr" => self.operator(n)?,
            "MinMaxExpr" => {
                let args = self.items(n, "args")?;
                self.charge(COLLATED.saturating_mul(total(&args)));
                args.iter().fold(Size::default(), |a, b| a.max(*b))
            }
            "CaseExpr" => {
                let arg = self.field(n, "arg")?;
                let mut result = self.field(n, "defresult")?;
                for when in n.get("args").and_then(Value::as_array).into_iter().flatten() {
                    let Some(("CaseWhen", when)) = when.as_object().and_then(node) else {
                        continue;
                    };
                    let test = self.field(when, "expr")?;
                    if arg.bytes > 0 {
                        self.charge(LIGHT.saturating_mul(arg.bytes.saturating_add(test.bytes)));
                    }
                    result = result.max(self.field(when, "result")?);
                }
                result
            }
            "RowExpr" | "AArrayExpr" => {
                let items = self.items(n, if kind == "RowExpr" { "args" } else { "elements" })?;
                Size {
                    bytes: total(&items).saturating_add(8 * items.len() as u64),
                    digits: NUMBER_DIGITS,
                }
            }
            "SubLink" => self.sublink(n)?,
            "RangeSubselect" | "CommonTableExpr" => {
                let query = if kind == "RangeSubselect" {
                    "subquery"
                } else {
                    "ctequery"
                };
                let recursive = kind == "CommonTableExpr"
                    && n.get("ctename")
                        .and_then(Value::as_str)
                        .is_some_and(|name| reads_table(n.get(query), name));
                self.recursive += u32::from(recursive);
                let mut output = Size::default();
                for (name, value) in n {
                    if name == query {
                        output = self.nested(Some(value))?;
                    } else {
                        self.visit(value)?;
                    }
                }
                // Columns renamed by position (`AS s(a, b)`, `c(n) AS`): each
                // may be any of the query's.
                let renamed = n
                    .get("aliascolnames")
                    .or_else(|| n.get("alias").and_then(|a| a.get("colnames")));
                let work = self.inner.work;
                for column in strings_of(renamed) {
                    self.depth += 1;
                    self.named(Some(column), output, work);
                    self.depth -= 1;
                }
                self.recursive -= u32::from(recursive);
                Size::default()
            }
            "NullTest" | "BooleanTest" | "BoolExpr" => {
                self.fields(n)?;
                Size::SMALL
            }
            "SqlvalueFunction" => Size::SMALL,
            _ => self.fields(n)?,
        })
    }

    /// `x.*`, `*`, or a bare name of a table, derived table, CTE or
    /// function in FROM: a whole row.
    fn is_row_ref(&self, n: &Map<String, Value>) -> bool {
        let fields = n.get("fields").and_then(Value::as_array);
        let fields: Vec<&Value> = fields.into_iter().flatten().collect();
        let star = fields
            .last()
            .is_some_and(|f| f.get("node").and_then(|n| n.get("AStar")).is_some());
        let bare = match fields.as_slice() {
            [one] => one
                .pointer("/node/String/sval")
                .and_then(Value::as_str)
                .is_some_and(|name| self.names.contains(name)),
            _ => false,
        };
        star || bare
    }

    fn call(&mut self, n: &Map<String, Value>, from_function: bool) -> Result<Size, Refusal> {
        let name = last_name(n.get("funcname")).unwrap_or_default();
        let mut args = Vec::new();
        for arg in n.get("args").and_then(Value::as_array).into_iter().flatten() {
            self.array_ok = from_function;
            args.push(self.visit(arg)?);
        }
        self.array_ok = false;
        for clause in ["agg_order", "agg_filter", "over"] {
            self.field(n, clause)?;
        }
        let weight = if LIGHT_CALLS.contains(&name) {
            LIGHT
        } else if COLLATED_CALLS.contains(&name) {
            COLLATED
        } else {
            HEAVY
        };
        self.charge(weight.saturating_mul(total(&args)));
        let widest = args.iter().fold(Size::default(), |a, b| a.max(*b));
        if from_function {
            // Its columns are parts of its arguments (elements, members).
            return Ok(widest);
        }
        Ok(match name {
            "mod" => {
                let (l, r) = pair(&args);
                self.charge(digit_pairs(l, r));
                Size {
                    bytes: r.bytes.max(l.bytes),
                    digits: r.digits,
                }
            }
            "sqrt" => {
                self.charge(digit_pairs(widest, widest));
                widest
            }
            "sum" | "avg" => Size {
                bytes: widest.bytes.max(Size::SMALL.bytes),
                digits: (widest.digits + NUMBER_DIGITS).min(MAX_DIGITS),
            },
            "abs" | "ceil" | "ceiling" | "coalesce" | "floor" | "greatest" | "lag" | "lead" | "least"
            | "max" | "min" | "nullif" | "round" | "trunc" | "sign" => widest,
            // `concat_ws` writes its separator between every two arguments.
            "concat_ws" => Size {
                bytes: total(&args).saturating_add(args.first().map_or(0, |sep| {
                    sep.bytes.saturating_mul(args.len().saturating_sub(2) as u64)
                })),
                digits: NUMBER_DIGITS,
            },
            _ if CONCATENATING.contains(&name) => Size {
                bytes: total(&args),
                digits: NUMBER_DIGITS,
            },
            _ if JSON_BUILDING.contains(&name) => Size {
                bytes: total(&args).saturating_mul(6).saturating_add(16),
                digits: NUMBER_DIGITS,
            },
            // Case mapping can triple a character's bytes (ICU: `ΐ` to `Ϊ́`); hex doubles.
            "upper" | "lower" | "hex" => Size {
                bytes: widest.bytes.saturating_mul(3),
                digits: NUMBER_DIGITS,
            },
            "substr" | "substring" | "left" | "right" | "trim" | "btrim" | "ltrim" | "rtrim" => Size {
                bytes: widest.bytes,
                digits: NUMBER_DIGITS,
            },
            // Its output is its format's, each pattern character at most 16
            // wide (`J` of an interval of huge years: 11).
            "to_char" => Size {
                bytes: widest.bytes.saturating_mul(16),
                digits: NUMBER_DIGITS,
            },
            _ => Size::SMALL,
        })
    }

    fn operator(&mut self, n: &Map<String, Value>) -> Result<Size, Refusal> {
        let op = last_name(n.get("name")).unwrap_or_default();
        let kind = n.get("kind").and_then(Value::as_i64).unwrap_or_default();
        let kind = i32::try_from(kind)
            .ok()
            .and_then(|k| pg_query::protobuf::AExprKind::try_from(k).ok());
        use pg_query::protobuf::AExprKind as K;
        let l = self.field(n, "lexpr")?;
        self.array_ok = matches!(kind, Some(K::AexprOpAny | K::AexprOpAll));
        let r = if kind == Some(K::AexprIn) {
            Size::default()
        } else {
            self.field(n, "rexpr")?
        };
        self.array_ok = false;
        let (lb, rb) = (l.bytes, r.bytes);
        let both = lb.saturating_add(rb);
        match kind {
            // `a IN (x, y, ...)`: the list's items, each compared.
            Some(K::AexprIn) => {
                let items = match n.get("rexpr").and_then(|r| r.as_object()).and_then(node) {
                    Some(("List", list)) => self.items(list, "items")?,
                    _ => vec![self.field(n, "rexpr")?],
                };
                let compared = lb
                    .saturating_mul(items.len() as u64)
                    .saturating_add(total(&items));
                self.charge(LIGHT.saturating_mul(compared));
                return Ok(Size::SMALL);
            }
            Some(K::AexprOp | K::AexprOpAny | K::AexprOpAll) => {}
            _ => {
                // DISTINCT, NULLIF, BETWEEN: comparisons.
                self.charge(COLLATED.saturating_mul(both.saturating_mul(2)));
                return Ok(l.max(r));
            }
        }
        let weight = if LIGHT_OPERATORS.contains(&op) {
            LIGHT
        } else if COLLATED_OPERATORS.contains(&op) {
            COLLATED
        } else {
            HEAVY
        };
        self.charge(weight.saturating_mul(both));
        Ok(match op {
            "||" => Size {
                bytes: both,
                digits: NUMBER_DIGITS,
            },
            "*" => {
                self.charge(digit_pairs(l, r));
                Size {
                    bytes: both,
                    digits: (l.digits.saturating_add(r.digits)).min(MAX_DIGITS),
                }
            }
            "/" | "%" => {
                self.charge(digit_pairs(l, r));
                Size {
                    bytes: both,
                    digits: (l.digits.saturating_add(r.digits).saturating_add(NUMBER_DIGITS)).min(MAX_DIGITS),
                }
            }
            // Not even the one digit a sum may gain: a counter in a recursive
            // CTE must keep a stable bound (PostgreSQL's numerics stop at
            // MAX_DIGITS, and a quadratic cost needs thousands).
            // Inside a CTE that reads itself, `x + x` may double a number at
            // every step: any number there may reach PostgreSQL's maximum.
            "+" | "-" => Size {
                bytes: lb.max(rb),
                digits: match self.recursive > 0 && l.digits.max(r.digits) > NUMBER_DIGITS {
                    true => MAX_DIGITS,
                    false => l.digits.max(r.digits),
                },
            },
            "->" | "->>" | "#>" | "#>>" | "&" | "|" | "#" | "<<" | ">>" => l.max(r),
            _ => Size::SMALL,
        })
    }

    fn sublink(&mut self, n: &Map<String, Value>) -> Result<Size, Refusal> {
        use pg_query::protobuf::SubLinkType as T;
        let kind = n.get("sub_link_type").and_then(Value::as_i64).unwrap_or_default();
        let kind = i32::try_from(kind).ok().and_then(|k| T::try_from(k).ok());
        if kind == Some(T::ArraySublink) {
            return Err(Refusal::Forbidden(
                "ARRAY(subquery) is not allowed: it builds one value from any number of rows, which \
                 PostgreSQL then works on without interruption; join or use = ANY (subquery)"
                    .into(),
            ));
        }
        let test = self.field(n, "testexpr")?;
        let output = self.nested(n.get("subselect"))?;
        if test.bytes > 0 {
            // `x = ANY (subquery)`: one comparison per row of the subquery.
            self.charge(COLLATED.saturating_mul(test.bytes.saturating_add(output.bytes)));
        }
        Ok(match kind {
            Some(T::ExprSublink | T::MultiexprSublink) => output.max(Size {
                bytes: self.derived.bytes,
                digits: self.derived.digits,
            }),
            _ => Size::SMALL,
        })
    }
}

/// True for a node that makes an array: `ARRAY[...]`, `ARRAY(...)` or a cast to an array type.
pub fn is_array(kind: &str, n: &Map<String, Value>) -> bool {
    match kind {
        "AArrayExpr" => true,
        "SubLink" => n.get("sub_link_type").and_then(Value::as_i64) == Some(7),
        "TypeCast" => n
            .get("type_name")
            .and_then(|t| t.get("array_bounds"))
            .and_then(Value::as_array)
            .is_some_and(|b| !b.is_empty()),
        _ => false,
    }
}

/// `{"node": {Kind: {...}}}` as (Kind, fields).
fn node(fields: &Map<String, Value>) -> Option<(&str, &Map<String, Value>)> {
    if fields.len() != 1 {
        return None;
    }
    let (kind, inner) = fields.get("node")?.as_object()?.iter().next()?;
    Some((kind.as_str(), inner.as_object()?))
}

fn last_name(list: Option<&Value>) -> Option<&str> {
    list?
        .as_array()?
        .last()?
        .get("node")?
        .get("String")?
        .get("sval")?
        .as_str()
}

fn literal(n: &Map<String, Value>) -> Size {
    let text = |v: &Value| {
        v.as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    match n
        .get("val")
        .and_then(Value::as_object)
        .and_then(|v| v.iter().next())
        .map(|(k, v)| (k.as_str(), v))
    {
        // An unknown-typed string may become a number, and `1e65000` is
        // 65,001 digits long: its digits are what it reads as.
        Some(("Sval" | "Fval" | "Bsval", v)) => {
            let text = text(v).unwrap_or_default();
            let digits = numeric_digits(&text);
            Size {
                bytes: (text.len() as u64).max(digits),
                digits,
            }
        }
        _ => Size::SMALL,
    }
}

/// The digits `text` has as a numeric (at most PostgreSQL's maximum): its
/// mantissa's, plus what an exponent adds before or after the point.
fn numeric_digits(text: &str) -> u64 {
    let text = text.trim();
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], text[at + 1..].trim().parse::<i64>().ok()),
        None => (text, Some(0)),
    };
    let digits = mantissa.bytes().filter(u8::is_ascii_digit).count() as u64;
    let shift = exponent.map_or(MAX_DIGITS, |e| e.unsigned_abs());
    digits
        .max(text.len() as u64)
        .saturating_add(shift)
        .min(MAX_DIGITS)
}

/// The tables the statement inserts into or updates (anywhere, CTEs too),
/// once per time a row of theirs runs their own expressions.
pub fn written_tables(tree: &Value) -> Vec<&str> {
    let mut stack = vec![tree];
    let mut written = Vec::new();
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                if let Some(("InsertStmt" | "UpdateStmt", stmt)) = node(fields)
                    && let Some(name) = stmt
                        .get("relation")
                        .and_then(|r| r.get("relname"))
                        .and_then(Value::as_str)
                {
                    written.push(name);
                    // ON CONFLICT DO UPDATE runs the table's expressions on the
                    // insert attempt and again on the update.
                    let update = stmt
                        .get("on_conflict_clause")
                        .and_then(|c| c.get("action"))
                        .and_then(Value::as_i64)
                        .is_some_and(|a| a == pg_query::protobuf::OnConflictAction::OnconflictUpdate as i64);
                    if update {
                        written.push(name);
                    }
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    written
}

/// A SELECT or RETURNING item that is `*` or `x.*`.
fn star_target(target: &Value) -> bool {
    let fields = target
        .pointer("/node/ResTarget/val/node/ColumnRef/fields")
        .and_then(Value::as_array);
    fields
        .and_then(|f| f.last())
        .is_some_and(|last| last.pointer("/node/AStar").is_some())
}

/// The names a bare column reference could take for a whole row: derived
/// tables and CTEs (refused there), and tables, views and their aliases
/// (counted as a row of [`VIEW_ROWS`]).
fn names(tree: &Value) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut stack = vec![tree];
    let (mut derived, mut relations) = (BTreeSet::new(), BTreeSet::new());
    let alias = |n: &Map<String, Value>| {
        n.get("alias")
            .and_then(|a| a.get("aliasname"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                match node(fields) {
                    // A function in FROM: its alias names its value (`unnest(...) AS u`).
                    Some(("RangeFunction", n)) => {
                        stack.extend(n.get("functions"));
                        continue;
                    }
                    Some(("RangeSubselect" | "JoinExpr", n)) => derived.extend(alias(n)),
                    Some(("CommonTableExpr", n)) => {
                        derived.extend(n.get("ctename").and_then(Value::as_str).map(str::to_owned))
                    }
                    _ => {}
                }
                // A RangeVar, wrapped in a node or not (an INSERT's or UPDATE's own relation is not).
                if let Some(name) = fields.get("relname").and_then(Value::as_str) {
                    relations.insert(name.to_owned());
                    relations.extend(alias(fields));
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    (derived, relations)
}

/// The name a SELECT item's column gets: its alias, a column's own name,
/// or a function's.
fn target_name(target: &Value) -> Option<&str> {
    let t = target.pointer("/node/ResTarget")?;
    match t.get("name").and_then(Value::as_str) {
        Some(name) if !name.is_empty() => Some(name),
        _ => {
            let val = t.pointer("/val/node")?;
            last_name(val.pointer("/ColumnRef/fields"))
                .or_else(|| last_name(val.pointer("/FuncCall/funcname")))
        }
    }
}

/// The String nodes of a list, in order.
fn strings_of(list: Option<&Value>) -> Vec<&str> {
    list.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|item| item.pointer("/node/String/sval").and_then(Value::as_str))
        .collect()
}

fn fields_len(n: &Map<String, Value>) -> usize {
    n.get("fields").and_then(Value::as_array).map_or(0, Vec::len)
}

/// Whether the query `value` names the table `name` (a CTE that reads itself).
fn reads_table(value: Option<&Value>, name: &str) -> bool {
    let mut stack: Vec<&Value> = value.into_iter().collect();
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                if let Some(("RangeVar", range)) = node(fields)
                    && range.get("relname").and_then(Value::as_str) == Some(name)
                {
                    return true;
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    false
}

/// The size of `arg` cast to `type_name`, and the cast's cost per byte of `arg`.
fn cast(type_name: Option<&Value>, arg: Size) -> Result<(Size, u64), Refusal> {
    let name = last_name(type_name.and_then(|t| t.get("names"))).unwrap_or_default();
    let typmods = type_name
        .and_then(|t| t.get("typmods"))
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    // As text, a bytea doubles (hex) and jsonb gains a space per member; a
    // char(n) is padded to n characters (up to four bytes each).
    let mut bytes = arg.bytes.saturating_mul(2).saturating_add(32);
    if matches!(name, "bpchar" | "char" | "character") && typmods > 0 {
        bytes = bytes.max(precision(type_name).saturating_mul(4));
    }
    let weight = if matches!(name, "json" | "jsonb" | "float4" | "float8") {
        HEAVY
    } else {
        LIGHT
    };
    let digits = match name {
        "numeric" | "decimal" if typmods == 0 => return Err(bare_numeric("a cast to")),
        "numeric" | "decimal" => precision(type_name).min(MAX_DIGITS),
        _ => NUMBER_DIGITS,
    };
    Ok((Size { bytes, digits }, weight))
}

/// The refusal of a numeric without a precision.
pub fn bare_numeric(what: &str) -> Refusal {
    Refusal::Forbidden(format!(
        "{what} numeric without a precision is not allowed: write numeric(p, s) (p at most 1000); a bare \
         numeric holds up to 147,455 digits, and one multiplication or division of two of them takes \
         seconds that PostgreSQL does not interrupt"
    ))
}

/// The precision of `numeric(p, s)`.
fn precision(type_name: Option<&Value>) -> u64 {
    type_name
        .and_then(|t| t.get("typmods"))
        .and_then(Value::as_array)
        .and_then(|m| m.first())
        .and_then(|p| p.pointer("/node/AConst/val/Ival/ival"))
        .and_then(Value::as_u64)
        .unwrap_or(MAX_DIGITS)
}

fn total(sizes: &[Size]) -> u64 {
    sizes.iter().fold(0u64, |sum, s| sum.saturating_add(s.bytes))
}

fn pair(args: &[Size]) -> (Size, Size) {
    (
        args.first().copied().unwrap_or_default(),
        args.get(1).copied().unwrap_or_default(),
    )
}

/// Nanoseconds of a numeric multiplication or division of `l` by `r`.
fn digit_pairs(l: Size, r: Size) -> u64 {
    (l.digits / 4 + 1)
        .saturating_mul(r.digits / 4 + 1)
        .saturating_mul(DIGIT_PAIR)
}

#[cfg(test)]
mod tests;
