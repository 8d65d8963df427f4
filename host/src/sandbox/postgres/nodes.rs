//! Every node of a statement's parse tree, as PostgreSQL's own parser
//! (`pg_query`) gives it in JSON, in one pass and without recursion (a
//! tree is as deep as the statement's nesting, which is bounded before
//! parsing but still deeper than a check should recurse).

use serde_json::Value;

/// The nodes of `tree`, each as (kind, fields): a `Node` is
/// `{"node": {Kind: {...}}}`. Every node is seen once, parents before their
/// children; the order among siblings is not fixed.
pub(crate) fn nodes(tree: &Value) -> Nodes<'_> {
    Nodes { stack: vec![tree] }
}

pub(crate) struct Nodes<'a> {
    stack: Vec<&'a Value>,
}

impl<'a> Iterator for Nodes<'a> {
    type Item = (&'a str, &'a Value);

    fn next(&mut self) -> Option<Self::Item> {
        while let Some(value) = self.stack.pop() {
            match value {
                Value::Array(items) => self.stack.extend(items),
                Value::Object(fields) => {
                    if let (1, Some(Value::Object(kind))) = (fields.len(), fields.get("node"))
                        && let Some((name, inner)) = kind.iter().next()
                    {
                        self.stack.push(inner);
                        return Some((name.as_str(), inner));
                    }
                    self.stack.extend(fields.values());
                }
                _ => {}
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_is_seen_once() {
        let sql = "SELECT (a + 1) * 2 FROM t WHERE b IN (SELECT c FROM u)";
        let parsed = pg_query::parse(sql, pg_query::ParserOptions::DEFAULT).unwrap();
        let tree = serde_json::to_value(&parsed.protobuf).unwrap();
        let mut kinds: Vec<&str> = nodes(&tree).map(|(kind, _)| kind).collect();
        kinds.sort_unstable();
        let count = |k: &str| kinds.iter().filter(|&&x| x == k).count();
        assert_eq!(count("SelectStmt"), 2);
        assert_eq!(count("ColumnRef"), 3);
        assert_eq!(count("AExpr"), 2);
        assert_eq!(count("SubLink"), 1);
    }
}
