//! Measures of JSON values that bound what a caller (or a model) may send.

use serde_json::Value;

/// Nesting depth of a JSON value (a scalar is 0, `{}` or `[]` is 1),
/// walked without recursion.
pub fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0_usize)];
    while let Some((value, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match value {
            Value::Array(a) => Box::new(a.iter()),
            Value::Object(o) => Box::new(o.values()),
            _ => continue,
        };
        deepest = deepest.max(depth + 1);
        stack.extend(children.map(|c| (c, depth + 1)));
    }
    deepest
}

/// Bytes of `value` as compact JSON text, counted without building the
/// text: the size of a JSON input whichever encoding brought it.
pub fn bytes(value: &Value) -> usize {
    /// A writer that keeps nothing but the count.
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(buf.len());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // A `Value` always serializes (its keys are strings) and counting never
    // fails; were it ever to, the input counts as too large, not as empty.
    serde_json::to_writer(&mut count, value).map_or(usize::MAX, |()| count.0)
}
