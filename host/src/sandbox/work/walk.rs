//! The walk over one statement's parse tree that counts its work and sizes
//! its values (see the module above for the model).

use super::outputs::default_in_rows;
use super::outputs::holds_kind;
use super::repeats::*;
use super::sizes::*;
use super::tree::*;
use super::*;
use crate::sandbox::postgres::plan_memory::{query_weight, weight};

/// A literal's bytes count as planned nodes at this many bytes each (about
/// the size of a node), since each copy holds them again.
const LITERAL_BYTES_PER_NODE: u64 = 64;

/// Regression (the review of the nineteenth adversarial read, issue 23): a
/// CTE that reads itself is stored, so its outputs cost its readers nothing,
/// and the walk counts nothing copied inside it either (its derived columns
/// by name would meet the CTE's own and never be stable). A subquery or CTE
/// inside it would be merged into it, copied per reference, uncounted.
fn nested_in_recursion() -> Refusal {
    Refusal::Forbidden(
        "a CTE that reads itself (WITH RECURSIVE) may not hold a subquery in FROM or a WITH of its \
         own: the planner copies their columns into every reference, which the statement guard \
         cannot count there; compute them in a CTE beside it"
            .into(),
    )
}

impl Walk {
    pub(super) fn charge(&mut self, ns: u64) {
        self.work = self.work.saturating_add(ns);
    }

    /// What the walk has counted so far.
    pub(super) fn spent(&self) -> Cost {
        Cost {
            work: self.work,
            nodes: self.nodes,
            memory: self.memory,
        }
    }

    /// What the walk has counted since `before`.
    pub(super) fn since(&self, before: Cost) -> Cost {
        Cost {
            work: self.work.saturating_sub(before.work),
            nodes: self.nodes.saturating_sub(before.nodes),
            memory: self.memory.saturating_sub(before.memory),
        }
    }

    /// A reference to a derived column: the planner copies its expression
    /// in, to be planned and evaluated here again.
    pub(super) fn copy_in(&mut self, cost: Cost) {
        self.charge(cost.work);
        self.nodes = self.nodes.saturating_add(cost.nodes);
        self.memory = self.memory.saturating_add(cost.memory);
        self.copied_memory = self.copied_memory.saturating_add(cost.memory);
    }

    /// What a nested query's outputs cost a reader: nothing if the query's
    /// rows are stored (a CTE that reads itself, or one written `AS
    /// MATERIALIZED`) or it is fenced by `OFFSET` / `LIMIT`, where the reader
    /// reads values, not expressions.
    pub(super) fn read_cost(&self, cost: Cost) -> Cost {
        let stored = self.recursive > 0 || self.materialized.last() == Some(&self.depth);
        if stored { Cost::default() } else { cost }
    }

    /// Records what a nested query's output column (or a FROM function's)
    /// can be, under `name` if it has one: `cost` is what evaluating it
    /// once cost.
    pub(super) fn named(&mut self, name: Option<&str>, size: Size, cost: Cost) {
        self.output(size, cost);
        let cost = self.read_cost(cost);
        if name.is_none() && self.depth > 0 {
            self.found_unnamed = true;
        }
        let Some(name) = name else { return };
        // Also under the name of the subquery or CTE it is an output of, for
        // the references that qualify it so.
        let owner = self.owners.last().filter(|(depth, _)| *depth == self.depth);
        let qualified = owner.map(|(_, owner)| format!("{owner}.{name}"));
        for key in std::iter::once(name.to_owned()).chain(qualified) {
            let entry = self.found.entry(key).or_default();
            *entry = Derived {
                bytes: entry.bytes.max(size.bytes),
                digits: entry.digits.max(size.digits),
                cost: entry.cost.max(cost),
                row: 0,
                row_cost: Cost::default(),
            };
        }
    }

    pub(super) fn output(&mut self, size: Size, cost: Cost) {
        let cost = self.read_cost(cost);
        self.inner = Derived {
            bytes: self.inner.bytes.max(size.bytes),
            digits: self.inner.digits.max(size.digits),
            cost: self.inner.cost.max(cost),
            ..self.inner
        };
    }

    pub(super) fn cap(&self, bytes: u64, what: &str) -> Result<(), Refusal> {
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
    pub(super) fn visit(&mut self, value: &Value) -> Result<Size, Refusal> {
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

    pub(super) fn fields(&mut self, fields: &Map<String, Value>) -> Result<Size, Refusal> {
        if fields.contains_key("target_list") || fields.contains_key("values_lists") {
            return self.query(fields);
        }
        // PostgreSQL 18's RETURNING (a plain message: `options`, `exprs`).
        if let (Some(exprs), true) = (fields.get("exprs"), fields.contains_key("options")) {
            return self.targets(exprs);
        }
        // A WITH: its CTEs may read themselves only if it says RECURSIVE.
        if let (Some(ctes), Some(recursive)) = (fields.get("ctes"), fields.get("recursive")) {
            let outer = std::mem::replace(&mut self.with_recursive, recursive.as_bool() == Some(true));
            let size = self.visit(ctes);
            self.with_recursive = outer;
            return size;
        }
        let mut size = Size::default();
        for value in fields.values() {
            size = size.max(self.visit(value)?);
        }
        Ok(size)
    }

    pub(super) fn field(&mut self, fields: &Map<String, Value>, name: &str) -> Result<Size, Refusal> {
        fields.get(name).map_or(Ok(Size::default()), |v| self.visit(v))
    }

    /// A list field's items, each sized.
    pub(super) fn items(&mut self, fields: &Map<String, Value>, name: &str) -> Result<Vec<Size>, Refusal> {
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
    pub(super) fn query(&mut self, fields: &Map<String, Value>) -> Result<Size, Refusal> {
        self.memory = self.memory.saturating_add(query_weight(fields));
        let grouped = self.grouped;
        self.grouped |= fields
            .get("group_clause")
            .and_then(Value::as_array)
            .is_some_and(|g| !g.is_empty());
        let output = self.query_fields(fields);
        self.grouped = grouped;
        output
    }

    fn query_fields(&mut self, fields: &Map<String, Value>) -> Result<Size, Refusal> {
        let mut output = Size::default();
        if is_set_operation(fields) {
            output = self.set_operation(fields)?;
        }
        // PostgreSQL's tree of a VALUES list has an empty SELECT list too, and
        // a SELECT's an empty VALUES list: only the one a query has outputs.
        // (Regression, the twenty-first adversarial read: a VALUES as a
        // UNION's first arm counted as an arm of no columns.)
        let values = fields
            .get("values_lists")
            .and_then(Value::as_array)
            .is_some_and(|v| !v.is_empty());
        for (name, value) in fields {
            match name.as_str() {
                "target_list" if values => {}
                "values_lists" if !values => {}
                "target_list" | "returning_list" => output = output.max(self.targets(value)?),
                "values_lists" => {
                    // The executor checks for interrupts between the rows, so
                    // what an item does with parameters or columns counts for
                    // the widest row only. An item of literals alone is
                    // folded by the planner, every row's at once: those sum.
                    // Its columns are `column1`, `column2`, ... by position,
                    // each the largest of its rows' (a VALUES of one row is
                    // pulled up into its reader like a subquery).
                    let rows_of = value.as_array().map_or(0, Vec::len);
                    if rows_of > 1 && holds_kind(value, "SetToDefault") {
                        return Err(default_in_rows());
                    }
                    let (before, mut widest, mut folded) = (self.work, 0, 0u64);
                    let mut columns: Vec<Output> = Vec::new();
                    let (mut rows, mut rows_cost) = (0u64, Cost::default());
                    for values in value.as_array().into_iter().flatten() {
                        self.work = before;
                        let row_start = self.spent();
                        let (mut row, mut row_folded) = (0u64, 0u64);
                        let items = values.pointer("/node/List/items").and_then(Value::as_array);
                        for (i, item) in items.into_iter().flatten().enumerate() {
                            let start = self.spent();
                            let size = self.visit(item)?;
                            output = output.max(size);
                            row = row.saturating_add(size.bytes);
                            let cost = self.since(start);
                            if columns.len() <= i {
                                columns.push(Output::new(Some(format!("column{}", i + 1)), size, cost));
                            }
                            columns[i] = columns[i].clone().max(size, cost);
                            if is_constant(item) {
                                row_folded = row_folded.saturating_add(cost.work);
                            }
                        }
                        self.cap(row, "a row")?;
                        rows = rows.max(row);
                        rows_cost = rows_cost.max(self.since(row_start));
                        let row_work = self.work - before;
                        widest = widest.max(row_work - row_folded);
                        folded = folded.saturating_add(row_folded);
                    }
                    self.work = before.saturating_add(widest).saturating_add(folded);
                    self.record(columns, rows, rows_cost);
                }
                // A UNION's arms: see `set_operation`.
                "larg" | "rarg" if is_set_operation(fields) => {}
                _ => {
                    self.visit(value)?;
                }
            }
        }
        Ok(output)
    }

    /// A SELECT or RETURNING list: its largest item; its whole row is held
    /// to the cap and, inside a subquery or CTE, recorded for its readers.
    pub(super) fn targets(&mut self, value: &Value) -> Result<Size, Refusal> {
        let mut output = Size::default();
        let (start, mut row) = (self.spent(), 0u64);
        let mut columns = Vec::new();
        for target in value.as_array().into_iter().flatten() {
            let before = self.spent();
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
                    self.copy_in(self.derived.row_cost);
                    Size {
                        bytes: row.max(self.derived.row),
                        digits: self.derived.digits,
                    }
                }
                false => self.visit(target)?,
            };
            output = output.max(size);
            row = row.saturating_add(size.bytes);
            columns.push(Output::new(
                target_name(target).map(str::to_owned),
                size,
                self.since(before),
            ));
        }
        self.cap(row, "a row")?;
        self.record(columns, row, self.since(start));
        Ok(output)
    }

    pub(super) fn nested(&mut self, value: Option<&Value>) -> Result<Size, Refusal> {
        self.depth += 1;
        let size = value.map_or(Ok(Size::default()), |v| self.visit(v));
        self.depth -= 1;
        size
    }

    pub(super) fn node(&mut self, kind: &str, n: &Map<String, Value>) -> Result<Size, Refusal> {
        if !std::mem::take(&mut self.array_ok) && is_array(kind, n) {
            return Err(Refusal::Forbidden(
                "an array is allowed only as the argument of a function in FROM (unnest(...)) and in \
                 = ANY (...) / <> ALL (...): anywhere else it can reach an operator that loops over both \
                 sides (jsonb - text[]), which PostgreSQL does not interrupt"
                    .into(),
            ));
        }
        let from_function = std::mem::take(&mut self.from_function);
        self.nodes = self.nodes.saturating_add(1);
        self.memory = self.memory.saturating_add(weight(kind, n));
        let size = self.sized(kind, n, from_function)?;
        self.cap(size.bytes, "a value")?;
        Ok(size)
    }

    pub(super) fn sized(
        &mut self,
        kind: &str,
        n: &Map<String, Value>,
        from_function: bool,
    ) -> Result<Size, Refusal> {
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
                let qualified = qualified_name(n.get("fields"));
                let qualifier = first_name(n.get("fields")).unwrap_or_default();
                let own = qualified
                    .as_ref()
                    .filter(|_| !self.aliases.contains(qualifier))
                    .and_then(|q| self.columns.get(q));
                // `t.a` of a table (or view) that no subquery, CTE, join or
                // function shares a name with: a stored column, whatever
                // derived columns are called `a` (a UNION ALL of tables'
                // columns `a` would otherwise feed on its own name).
                let stored = qualified.is_some()
                    && self.tables.contains(qualifier)
                    && !self.columns.contains_key(qualifier);
                let precise = own.is_some();
                let column = match own.or_else(|| name.and_then(|name| self.columns.get(name))) {
                    _ if stored => self.stored,
                    Some(column) => at_least(*column),
                    None if self.star || self.unnamed => at_least(self.derived),
                    None => self.stored,
                };
                // `x.f` (or `s.x.f`) may be field `f` of a derived column
                // `x` (the review of the twenty-first read: `ROW(...) AS x`):
                // every name it holds may be a copied column.
                let column = match stored || precise {
                    true => column,
                    false => strings_of(n.get("fields"))
                        .into_iter()
                        .filter_map(|f| self.columns.get(f))
                        .fold(column, |c, d| Derived {
                            cost: c.cost.max(d.cost),
                            ..c.max_size(*d)
                        }),
                };
                self.copy_in(column.cost);
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
            "AConst" => {
                // A literal is copied whole, and planned, with its node.
                let size = literal(n);
                self.nodes = self.nodes.saturating_add(size.bytes / LITERAL_BYTES_PER_NODE);
                size
            }
            "TypeCast" => {
                let to_json = is_json_cast(n.get("type_name"));
                if to_json {
                    json_cast_argument(n.get("arg"))?;
                    self.charge(super::json_keys::SORT_NS);
                }
                let arg = self.field(n, "arg")?;
                let (size, weight) = cast(n.get("type_name"), arg)?;
                // What the cast makes, not only what it reads: `''::char(n)`
                // is padded to n characters, and PostgreSQL folds a cast of a
                // literal into a constant of that size while planning (no
                // cancel reaches it) and keeps it in a cached plan, so its
                // bytes count as a literal's nodes too. Regression (the
                // fifty-second read): charged by its 0-byte argument, 300 of
                // them in 11 KB of SQL held 3 GB in the backend for 13 s.
                self.charge(weight.saturating_mul(arg.bytes));
                if size.bytes > arg.bytes.saturating_mul(2).saturating_add(32) {
                    self.charge(weight.saturating_mul(size.bytes));
                    self.nodes = self.nodes.saturating_add(size.bytes / LITERAL_BYTES_PER_NODE);
                }
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
                                let before = self.spent();
                                let size = self.visit(item)?;
                                // Its columns are no larger than its arguments.
                                if i == 0 {
                                    let work = self.since(before);
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
                // One comparison per argument, each against the greatest (or
                // least) so far: up to the widest argument every time.
                let args = self.items(n, "args")?;
                let widest = args.iter().fold(Size::default(), |a, b| a.max(*b));
                let compared = widest
                    .bytes
                    .saturating_mul(args.len() as u64)
                    .saturating_add(total(&args));
                self.charge(COLLATED.saturating_mul(compared));
                widest
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
            // As text (a cast, `concat`, `||`), a row quotes each item and
            // doubles every `"` and `\` in it: nested, the text doubles at
            // every level (the twenty-seventh read: a 1 MiB parameter eight
            // rows deep made 256 MiB in one expression, 2.6 s against a
            // 200 ms timeout, counted as 1 MiB). So each item counts twice,
            // with its quotes and separator. (An array stands only where its
            // elements are visited one by one, never as text: see above.)
            "RowExpr" | "AArrayExpr" => {
                let items = self.items(n, if kind == "RowExpr" { "args" } else { "elements" })?;
                let twice = if kind == "RowExpr" { 2 } else { 1 };
                Size {
                    bytes: total(&items)
                        .saturating_mul(twice)
                        .saturating_add(8 * items.len() as u64)
                        .saturating_add(2),
                    digits: NUMBER_DIGITS,
                }
            }
            "SubLink" => self.sublink(n)?,
            "RangeSubselect" | "CommonTableExpr" => {
                if self.recursive > 0 {
                    return Err(nested_in_recursion());
                }
                let query = if kind == "RangeSubselect" {
                    "subquery"
                } else {
                    "ctequery"
                };
                // Regression (the twenty-first adversarial read, issue 23):
                // without RECURSIVE, a CTE's own name in its body is the
                // table of that name, and the CTE is copied into its readers.
                let recursive = kind == "CommonTableExpr"
                    && self.with_recursive
                    && n.get("ctename")
                        .and_then(Value::as_str)
                        .is_some_and(|name| reads_table(n.get(query), name));
                let always = pg_query::protobuf::CteMaterialize::Always as i64;
                // Stored, or fenced by OFFSET / LIMIT: planned on its own,
                // its readers read values (`sandbox::postgres::fences`).
                let materialized = n.get("ctematerialized").and_then(Value::as_i64) == Some(always)
                    || crate::sandbox::postgres::fences::fenced_query(n.get(query));
                self.recursive += u32::from(recursive);
                if materialized {
                    self.materialized.push(self.depth + 1);
                }
                let owner = match kind {
                    "RangeSubselect" => n.get("alias").and_then(|a| a.get("aliasname")),
                    _ => n.get("ctename"),
                };
                let owner = owner.and_then(Value::as_str).map(str::to_owned);
                self.owners.extend(owner.map(|o| (self.depth + 1, o)));
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
                let cost = self.inner.cost;
                for column in strings_of(renamed) {
                    self.depth += 1;
                    self.named(Some(column), output, cost);
                    self.depth -= 1;
                }
                if materialized {
                    self.materialized.pop();
                }
                if self
                    .owners
                    .last()
                    .is_some_and(|(depth, _)| *depth == self.depth + 1)
                {
                    self.owners.pop();
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
    pub(super) fn is_row_ref(&self, n: &Map<String, Value>) -> bool {
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
}
