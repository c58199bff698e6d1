//! `Conditions`: whether one holds in a deployment with given parameter values.

use std::collections::BTreeMap;

use serde_yaml::Value;

use super::model::Template;
use super::yaml::intrinsic;

impl Template {
    /// Whether condition `name` holds in a deployment with these parameter values (a
    /// parameter not in `params`: its `Default`). Understands `!Equals`, `!Not`, `!And`,
    /// `!Or`, `!Condition` and `!Ref` to a parameter; anything else is an error, not a
    /// guess.
    pub fn condition_holds(
        &self,
        name: &str,
        params: &BTreeMap<String, String>,
    ) -> Result<bool, String> {
        self.condition_depth(name, params, 0)
    }

    fn condition_depth(
        &self,
        name: &str,
        params: &BTreeMap<String, String>,
        depth: usize,
    ) -> Result<bool, String> {
        let c = self
            .conditions
            .get(name)
            .ok_or(format!("no condition {name}"))?;
        self.holds(c, params, depth + 1)
            .map_err(|e| format!("condition {name}: {e}"))
    }

    pub(super) fn holds(
        &self,
        v: &Value,
        params: &BTreeMap<String, String>,
        depth: usize,
    ) -> Result<bool, String> {
        if depth > 16 {
            return Err("conditions nest too deep (a cycle?)".into());
        }
        let (f, arg) = intrinsic(v).ok_or(format!("{v:?} is not a condition function"))?;
        let args = || arg.as_sequence().map(Vec::as_slice).unwrap_or_default();
        match (f.as_str(), args()) {
            ("Equals", [a, b]) => Ok(self.scalar(a, params)? == self.scalar(b, params)?),
            ("Not", [c]) => Ok(!self.holds(c, params, depth + 1)?),
            ("And", cs) if !cs.is_empty() => cs
                .iter()
                .try_fold(true, |all, c| Ok(all && self.holds(c, params, depth + 1)?)),
            ("Or", cs) if !cs.is_empty() => cs
                .iter()
                .try_fold(false, |any, c| Ok(any || self.holds(c, params, depth + 1)?)),
            ("Condition", _) => {
                let other = arg.as_str().ok_or("!Condition needs a name")?;
                self.condition_depth(other, params, depth)
            }
            _ => Err(format!("!{f} {arg:?} is not understood")),
        }
    }

    /// A literal, or `!Ref` to a parameter, as a string.
    fn scalar(&self, v: &Value, params: &BTreeMap<String, String>) -> Result<String, String> {
        match v {
            Value::String(s) => Ok(s.clone()),
            Value::Number(n) => Ok(n.to_string()),
            Value::Bool(b) => Ok(b.to_string()),
            _ => match intrinsic(v) {
                Some((f, Value::String(p))) if f == "Ref" => params
                    .get(p)
                    .cloned()
                    .or_else(|| self.parameters.get(p).cloned().flatten())
                    .ok_or(format!("parameter {p} has no value and no Default")),
                _ => Err(format!("{v:?}: only a literal or !Ref to a parameter")),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::parse;

    #[test]
    fn conditions_evaluate_or_say_why_not() {
        let t = parse(
            "Parameters:\n  P: {Type: String, Default: a}\n  Q: {Type: String}\nConditions:\n  \
             IsA: !Equals [!Ref P, a]\n  NotA: !Not [!Condition IsA]\n  \
             Both: !And [!Condition IsA, {'Fn::Equals': [{Ref: Q}, x]}]\n  \
             Either: !Or [!Condition NotA, !Equals [!Ref Q, x]]\n  \
             Odd: !Select [0, [a]]\n  Loop: !Condition Loop\nResources: {}\n",
        )
        .expect("parses");
        let p = |kv: &[(&str, &str)]| {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        assert_eq!(t.condition_holds("IsA", &p(&[])), Ok(true));
        assert_eq!(t.condition_holds("IsA", &p(&[("P", "b")])), Ok(false));
        assert_eq!(t.condition_holds("NotA", &p(&[("P", "b")])), Ok(true));
        assert_eq!(t.condition_holds("Both", &p(&[("Q", "x")])), Ok(true));
        assert_eq!(t.condition_holds("Both", &p(&[("Q", "y")])), Ok(false));
        assert_eq!(t.condition_holds("Either", &p(&[("Q", "x")])), Ok(true));
        assert_eq!(t.condition_holds("Either", &p(&[("Q", "y")])), Ok(false));
        for bad in ["Both", "Odd", "Loop", "Missing"] {
            assert!(t.condition_holds(bad, &p(&[])).is_err(), "{bad}");
        }
    }
}
