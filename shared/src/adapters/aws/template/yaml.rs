//! Reading template values: intrinsic functions in both forms, and a mapping's fields.

use serde_yaml::Value;

/// An intrinsic function, short (`!Sub x`) or long (`Fn::Sub: x`, `Ref: x`) form: its name
/// without `!`/`Fn::`, and its argument.
pub fn intrinsic(v: &Value) -> Option<(String, &Value)> {
    match v {
        Value::Tagged(t) => Some((
            t.tag.to_string().trim_start_matches('!').to_string(),
            &t.value,
        )),
        Value::Mapping(m) if m.len() == 1 => {
            let (k, arg) = m.iter().next()?;
            let k = k.as_str()?;
            if k == "Ref" {
                Some(("Ref".into(), arg))
            } else {
                k.strip_prefix("Fn::").map(|n| (n.to_string(), arg))
            }
        }
        _ => None,
    }
}

/// The logical id a value refers to: `!Ref X`, `!GetAtt X.Attr` or `!GetAtt [X, Attr]`.
pub fn referenced_id(v: &Value) -> Option<String> {
    let (name, arg) = intrinsic(v)?;
    match name.as_str() {
        "Ref" => arg.as_str().map(String::from),
        "GetAtt" => match arg {
            Value::String(s) => s.split('.').next().map(String::from),
            Value::Sequence(seq) => seq.first()?.as_str().map(String::from),
            _ => None,
        },
        _ => None,
    }
}

/// A literal string, or the pattern of `!Sub "pattern"` (or `!Sub [pattern, vars]`).
pub fn string_or_sub(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        _ => match intrinsic(v)? {
            (n, Value::String(s)) if n == "Sub" => Some(s.clone()),
            (n, Value::Sequence(seq)) if n == "Sub" => seq.first()?.as_str().map(String::from),
            _ => None,
        },
    }
}

pub(super) fn field<'a>(m: &'a Value, key: &str) -> Option<&'a Value> {
    m.as_mapping()?.get(key)
}

pub(super) fn text(m: &Value, key: &str) -> Option<String> {
    match field(m, key)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

pub(super) fn number(m: &Value, key: &str) -> Result<Option<u32>, String> {
    match field(m, key) {
        None => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| format!("{key}: not a small whole number")),
        Some(Value::String(s)) => s
            .parse()
            .map(Some)
            .map_err(|_| format!("{key}: not a number: {s:?}")),
        Some(_) => Err(format!("{key}: a literal number is expected")),
    }
}

pub(super) fn flag(m: &Value, key: &str) -> Result<bool, String> {
    match field(m, key) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) if s == "true" || s == "false" => Ok(s == "true"),
        Some(_) => Err(format!("{key}: a literal true or false is expected")),
    }
}

pub(super) fn seq<'a>(m: &'a Value, key: &str) -> &'a [Value] {
    field(m, key)
        .and_then(Value::as_sequence)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// A string or a list of strings (`Action: x` or `Action: [x, y]`).
pub(super) fn strings(v: Option<&Value>, ctx: &str) -> Result<Vec<String>, String> {
    match v {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Sequence(seq)) => seq
            .iter()
            .map(|x| {
                x.as_str()
                    .map(String::from)
                    .ok_or(format!("{ctx}: a list of strings is expected"))
            })
            .collect(),
        Some(_) => Err(format!("{ctx}: a string or a list of strings is expected")),
    }
}

#[cfg(test)]
mod tests {
    use serde_yaml::Value;

    use super::*;

    #[test]
    fn intrinsics_in_both_forms() {
        let v: Value = serde_yaml::from_str(
            "a: !GetAtt Q.Arn\nb: {Ref: X}\nc: !Sub 'x-${P}'\nd: {'Fn::GetAtt': [Y, Arn]}",
        )
        .unwrap();
        assert_eq!(field(&v, "a").and_then(referenced_id).as_deref(), Some("Q"));
        assert_eq!(field(&v, "b").and_then(referenced_id).as_deref(), Some("X"));
        assert_eq!(
            field(&v, "c").and_then(string_or_sub).as_deref(),
            Some("x-${P}")
        );
        assert_eq!(field(&v, "d").and_then(referenced_id).as_deref(), Some("Y"));
    }
}
