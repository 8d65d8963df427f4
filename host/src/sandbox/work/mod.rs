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
//!   is a nested loop over both); `x op ANY/ALL (array)` and GREATEST/LEAST
//!   run their operator once per element or argument, over all of `x` each
//!   time, and are counted so (`walk::any_all_array`).
//!
//! The planner merges subqueries and CTEs into the query that reads them,
//! copying a derived column's expression to every place it is named, and a
//! table's CHECK, DEFAULT, generated and index expressions run inside every
//! write (an adversarial read, issue 23). So the work counted is the whole
//! statement's (one row of VALUES at a time, except that the planner folds
//! the items of literals alone in every row at once, so those sum; guests'
//! sessions plan generically, so calls over parameters are never folded), a reference to a derived
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

/// The most queries (SELECTs, subqueries, CTE bodies, VALUES lists) one
/// statement may hold. [`row_work_ns`] carries derived columns one query
/// further each round, so it walks the whole tree once per query: 2,000
/// LATERAL subqueries in 64 KiB, each reading the one before, took minutes of
/// the guard's time, on a thread no deadline stops (the seventeenth
/// adversarial read, issue 23). At this bound the rounds take milliseconds.
pub const MAX_QUERIES: u64 = 64;

/// No value a statement builds may be larger than this many rows at the
/// bound: it is held in the backend's memory (and the host's, if returned)
/// before any limit looks at it.
pub const VALUE_ROWS: u64 = 64;

/// A view's columns together may be this many rows at the bound (a whole
/// row of a table is one, by the host's constraint; of a view, this many).
pub const VIEW_ROWS: u64 = 4;

mod calls;
pub mod json_keys;
mod outputs;
mod repeats;
mod sizes;
mod tree;
mod walk;

pub use sizes::COLUMN_DIGITS;
use sizes::Size;
pub use sizes::bare_numeric;
use tree::{aliases, count_queries, has_recursion, names, renamed_on_reading, star_target, tables};
pub use tree::{is_array, reads_table, written_tables};

/// Checks the work of one row of the statement `tree` (PostgreSQL's parse
/// tree as JSON), with every stored row and bound value at most `row_bytes`;
/// `hidden`: the work its tables' own expressions add to a write (see the
/// module docs). `Ok`: the plan nodes holding `work_mem` that the planner's
/// copies of derived columns add to the statement's own (for
/// `sandbox::postgres::plan_memory`).
pub fn check(tree: &Value, row_bytes: u64, hidden: u64) -> Result<u64, Refusal> {
    let measured = measure(tree, row_bytes, hidden)?;
    if measured.work > ROW_WORK_NS {
        return Err(too_much(measured.work, row_bytes));
    }
    Ok(measured.copied_memory)
}

/// The most parse nodes a statement may hold once the planner has copied
/// each derived column's expression into every reference to it. It merges
/// a subquery or CTE into its reader that way, level by level, so n levels
/// of ten references each are 10^n copies, made while planning, where no
/// deadline is looked at: at six levels 0.4 s and 335 MB, at eight more than
/// 6 GB (the review of the nineteenth adversarial read, issue 23). A 64 KiB
/// statement holds about 32,000 nodes of its own; this many planned take
/// about 40 ms and 35 MB.
pub const MAX_PLANNED_NODES: u64 = 100_000;

/// What evaluating an expression once costs, and what the planner gets with
/// each copy of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Cost {
    /// Work of evaluating it once, by the weights.
    work: u64,
    /// Its parse nodes (its derived columns' copied in): what the planner
    /// copies and plans again for each reference.
    nodes: u64,
    /// Its plan nodes that may each hold `work_mem` (a subquery's sorts
    /// and stored rows: `sandbox::postgres::plan_memory`'s weights).
    memory: u64,
}

impl Cost {
    /// Both, as when an expression is copied once per arm of a UNION.
    fn plus(self, other: Self) -> Self {
        Self {
            work: self.work.saturating_add(other.work),
            nodes: self.nodes.saturating_add(other.nodes),
            memory: self.memory.saturating_add(other.memory),
        }
    }

    fn max(self, other: Self) -> Self {
        Self {
            work: self.work.max(other.work),
            nodes: self.nodes.max(other.nodes),
            memory: self.memory.max(other.memory),
        }
    }
}

/// One output column of a query, for its readers.
#[derive(Debug, Clone)]
struct Output {
    name: Option<String>,
    size: Size,
    cost: Cost,
}

impl Output {
    fn new(name: Option<String>, size: Size, cost: Cost) -> Self {
        Self { name, size, cost }
    }

    fn max(self, size: Size, cost: Cost) -> Self {
        Self {
            size: self.size.max(size),
            cost: self.cost.max(cost),
            ..self
        }
    }
}

/// An arm of a set operation: its columns, its row's bytes and cost.
type Arm = (Vec<Output>, u64, Cost);

/// What a column reference may stand for: a stored value, or the
/// expression of a derived column (which the planner may copy in).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Derived {
    bytes: u64,
    digits: u64,
    /// The expression's cost.
    cost: Cost,
    /// A whole row of a derived table (`s`, `s.*`, `*`): all its columns.
    row: u64,
    /// The cost of all its columns' expressions.
    row_cost: Cost,
}

impl Derived {
    /// The larger sizes of both.
    fn max_size(self, other: Self) -> Self {
        Self {
            bytes: self.bytes.max(other.bytes),
            digits: self.digits.max(other.digits),
            ..self
        }
    }

    /// Its sizes and work, without what copies of it bring to the plan.
    fn values(self) -> Self {
        let values = |cost: Cost| Cost {
            work: cost.work,
            ..Cost::default()
        };
        Self {
            cost: values(self.cost),
            row_cost: values(self.row_cost),
            ..self
        }
    }

    /// A stored value: a column or parameter at the row bound, a whole row
    /// of a table or view at [`VIEW_ROWS`] of them, with no cost of its own.
    fn stored(row_bytes: u64) -> Self {
        Self {
            bytes: row_bytes,
            digits: COLUMN_DIGITS,
            cost: Cost::default(),
            row: VIEW_ROWS * row_bytes,
            row_cost: Cost::default(),
        }
    }
}

/// The most work, in nanoseconds by the weights, that one row of the
/// statement may take.
pub fn row_work_ns(tree: &Value, row_bytes: u64, hidden: u64) -> Result<u64, Refusal> {
    Ok(measure(tree, row_bytes, hidden)?.work)
}

/// What [`measure`] finds.
struct Measured {
    work: u64,
    copied_memory: u64,
}

fn measure(tree: &Value, row_bytes: u64, hidden: u64) -> Result<Measured, Refusal> {
    let stored = Derived::stored(row_bytes);
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
    if queries > MAX_QUERIES {
        return Err(Refusal::Limit(format!(
            "this statement holds {queries} queries (SELECTs, subqueries, CTE bodies and VALUES lists); at \
             most {MAX_QUERIES} are allowed: the guard follows each one's values into the next, which costs \
             time for every pair of them"
        )));
    }
    let recursive = has_recursion(tree);
    let (names, relations) = names(tree);
    let aliases = aliases(tree);
    let tables = tables(tree);
    for round in 0..=queries + 1 {
        let mut walk = Walk {
            row_bytes,
            stored,
            columns: columns.clone(),
            derived,
            star,
            unnamed,
            inner: stored,
            names: names.clone(),
            relations: relations.clone(),
            aliases: aliases.clone(),
            tables: tables.clone(),
            ..Walk::default()
        };
        let written = walk.visit(tree)?;
        // A write past the row bound runs its table's expressions on the
        // larger values before the bound refuses the row.
        let scale = written.bytes.div_ceil(row_bytes.max(1)).max(1);
        let work = walk.work.saturating_add(hidden.saturating_mul(scale));
        if walk.nodes > MAX_PLANNED_NODES {
            return Err(too_many_copies(walk.nodes));
        }
        let measured = Measured {
            work,
            copied_memory: walk.copied_memory,
        };
        if work > ROW_WORK_NS {
            return Ok(measured);
        }
        let found_unnamed = walk.found_unnamed || renamed;
        let values = |c: &Columns| {
            c.iter()
                .map(|(k, d)| (k.clone(), d.values()))
                .collect::<Columns>()
        };
        let stable = values(&walk.found) == values(&columns)
            && walk.inner.values() == derived.values()
            && walk.found_star == star
            && found_unnamed == unnamed;
        // Copies grow by name where a recursive CTE's column meets a
        // reader's of the same name; the real copies are a chain of at most
        // `queries` levels, carried whole by then.
        let copies_carried = (walk.found == columns && walk.inner == derived) || round == queries + 1;
        if (stable && copies_carried) || (!recursive && round == queries + 1) {
            return Ok(measured);
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

/// Checks a view's query: PostgreSQL runs a view's output expressions
/// inside the statements that read it (where several views' add up in one
/// row, unseen by [`check`]), so a view may only select and rename columns.
/// Its filters and joins run in nodes of their own, row by row, and are
/// held to [`check`]'s bound.
pub fn check_view(tree: &Value, row_bytes: u64) -> Result<u64, Refusal> {
    let mut stack = vec![tree];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                if let Some(targets) = fields.get("target_list") {
                    let stored = Derived::stored(row_bytes);
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

fn too_many_copies(nodes: u64) -> Refusal {
    Refusal::Limit(format!(
        "PostgreSQL's planner copies a subquery's or CTE's computed columns into every place that \
         reads them: this statement would be planned as up to {nodes} expression nodes, at most \
         {MAX_PLANNED_NODES}, and planning is not interrupted at the deadline; read each computed \
         column fewer times, or compute it in a CTE written AS MATERIALIZED"
    ))
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
    /// Parse nodes and `work_mem` plan nodes counted so far, copies of
    /// derived columns included (see [`Cost`]).
    nodes: u64,
    memory: u64,
    /// The part of `memory` that references to derived columns copied in.
    copied_memory: u64,
    /// Nesting of subqueries and CTEs around the node being visited.
    depth: u32,
    /// Inside the body of a CTE that reads itself: PostgreSQL materializes
    /// it (a worktable), so its expressions are not copied into readers.
    recursive: u32,
    /// Inside a `WITH RECURSIVE`'s list of CTEs.
    with_recursive: bool,
    /// The depths of the bodies of CTEs written `AS MATERIALIZED` around
    /// the node: their rows are stored, so their outputs are read, not
    /// copied.
    materialized: Vec<u32>,
    /// The subqueries and CTEs around the node, by the depth of their body
    /// and the name their readers qualify its columns by.
    owners: Vec<(u32, String)>,
    /// The arms of the set operations being walked, by their depth.
    arms: Vec<(u32, Vec<Arm>)>,
    /// The names in FROM that are not a subquery's or CTE's (see
    /// [`tree::aliases`]): a column they qualify is looked up by its name.
    aliases: BTreeSet<String>,
    /// The names in FROM that can only be tables or views (see
    /// [`tree::tables`]).
    tables: BTreeSet<String>,
    /// The largest value, digits and costliest expression a nested query
    /// or function in FROM outputs (at least a stored value's).
    inner: Derived,
    /// The next node may be an array: it is the argument of a function in
    /// FROM, or the array of `= ANY (...)`.
    array_ok: bool,
    /// The next call is a function in FROM.
    from_function: bool,
    /// Inside a query with GROUP BY (or under one): its sums may be hashed.
    grouped: bool,
    /// Names a bare column reference may take for a whole row: tables,
    /// aliases, CTEs and functions in FROM.
    names: BTreeSet<String>,
    /// Tables, views and their aliases, whose bare names may be whole rows.
    relations: BTreeSet<String>,
}

#[cfg(test)]
mod tests;
