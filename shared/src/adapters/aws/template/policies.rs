//! IAM policies, key policies and roles: their statements, resources and principals.

use serde_yaml::Value;

use super::model::{PrincipalDef, ResourceDef, RoleDef, StatementDef};
use super::yaml::{field, intrinsic, referenced_id, seq, string_or_sub, strings, text};

fn resource(v: &Value, ctx: &str) -> Result<ResourceDef, String> {
    if let Value::String(s) = v {
        return Ok(ResourceDef::Literal(s.clone()));
    }
    let (name, arg) = intrinsic(v).ok_or(format!("{ctx}: unsupported resource {v:?}"))?;
    match name.as_str() {
        "GetAtt" => {
            let id = referenced_id(v).ok_or(format!("{ctx}: !GetAtt without a logical id"))?;
            let attr = match arg {
                Value::String(s) => s.split_once('.').map(|(_, a)| a.to_string()),
                Value::Sequence(seq) => seq.get(1).and_then(Value::as_str).map(String::from),
                _ => None,
            };
            match attr.as_deref() {
                Some("Arn") => Ok(ResourceDef::Arn {
                    logical_id: id,
                    suffix: String::new(),
                }),
                other => Err(format!(
                    "{ctx}: !GetAtt {id}.{other:?}: only .Arn names a resource"
                )),
            }
        }
        "Sub" => {
            let pattern = string_or_sub(v).ok_or(format!("{ctx}: !Sub without a pattern"))?;
            let rest = pattern
                .strip_prefix("${")
                .and_then(|r| r.split_once(".Arn}"))
                .filter(|(id, _)| !id.contains(['$', '{', '}', ':']));
            match rest {
                Some((id, suffix)) if !suffix.contains("${") => Ok(ResourceDef::Arn {
                    logical_id: id.to_string(),
                    suffix: suffix.to_string(),
                }),
                _ if !pattern.contains("${") => Ok(ResourceDef::Literal(pattern)),
                _ => Err(format!(
                    "{ctx}: !Sub {pattern:?}: only \"${{X.Arn}}<suffix>\" is understood"
                )),
            }
        }
        "If" => match arg.as_sequence().map(Vec::as_slice) {
            Some([_, a, b]) => Ok(ResourceDef::Either(vec![
                resource(a, ctx)?,
                resource(b, ctx)?,
            ])),
            _ => Err(format!("{ctx}: !If needs [condition, a, b]")),
        },
        other => Err(format!("{ctx}: !{other} is not understood as a resource")),
    }
}

fn principal(v: &Value) -> PrincipalDef {
    if v.as_str() == Some("*") {
        return PrincipalDef::Anyone;
    }
    let Some(aws) = field(v, "AWS") else {
        return PrincipalDef::Other(format!("{v:?}"));
    };
    if aws.as_str() == Some("*") {
        return PrincipalDef::Anyone;
    }
    if let Some(id) = referenced_id(aws) {
        return PrincipalDef::Role(id);
    }
    match string_or_sub(aws) {
        Some(s) if s.ends_with(":root") => PrincipalDef::Account,
        other => PrincipalDef::Other(other.unwrap_or_else(|| format!("{aws:?}"))),
    }
}

/// The statements of a policy document given as JSON (or YAML) text, such as an IAM
/// policy kept outside the template.
pub fn policy_document(text: &str) -> Result<Vec<StatementDef>, String> {
    let doc: Value = serde_yaml::from_str(text).map_err(|e| format!("policy document: {e}"))?;
    statements(Some(&doc), "policy")
}

/// The statements of a policy document.
pub(super) fn statements(doc: Option<&Value>, ctx: &str) -> Result<Vec<StatementDef>, String> {
    let list = match doc.and_then(|d| field(d, "Statement")) {
        None => return Ok(Vec::new()),
        Some(Value::Sequence(seq)) => seq.clone(),
        Some(one) => vec![one.clone()],
    };
    let mut out = Vec::new();
    for (i, st) in list.iter().enumerate() {
        let ctx = format!("{ctx}.Statement[{i}]");
        let resources = match field(st, "Resource") {
            None => Vec::new(),
            Some(Value::Sequence(seq)) => seq
                .iter()
                .map(|r| resource(r, &ctx))
                .collect::<Result<_, _>>()?,
            Some(one) => vec![resource(one, &ctx)?],
        };
        if field(st, "NotAction").is_some() || field(st, "NotResource").is_some() {
            return Err(format!("{ctx}: NotAction / NotResource are not understood"));
        }
        out.push(StatementDef {
            sid: text(st, "Sid"),
            effect: text(st, "Effect").ok_or(format!("{ctx}: no Effect"))?,
            actions: strings(field(st, "Action"), &format!("{ctx}.Action"))?,
            resources,
            principal: field(st, "Principal").map(principal),
            condition: field(st, "Condition").cloned(),
        });
    }
    Ok(out)
}

pub(super) fn role(id: &str, p: &Value) -> Result<RoleDef, String> {
    let mut stmts = Vec::new();
    let mut conditional = Vec::new();
    for (i, pol) in seq(p, "Policies").iter().enumerate() {
        let ctx = format!("{id}.Policies[{i}]");
        match intrinsic(pol) {
            Some((n, arg)) if n == "If" => {
                let branches = arg.as_sequence().map(Vec::as_slice);
                let Some([cond, policy, otherwise]) = branches else {
                    return Err(format!("{ctx}: !If needs [condition, policy, otherwise]"));
                };
                let cond = cond
                    .as_str()
                    .ok_or(format!("{ctx}: !If needs a condition name"))?;
                if referenced_id(otherwise).as_deref() != Some("AWS::NoValue") {
                    return Err(format!(
                        "{ctx}: only !If [condition, policy, !Ref AWS::NoValue] is understood"
                    ));
                }
                for st in statements(field(policy, "PolicyDocument"), &ctx)? {
                    conditional.push((cond.to_string(), st));
                }
            }
            _ => stmts.extend(statements(field(pol, "PolicyDocument"), &ctx)?),
        }
    }
    let (mut managed, mut external) = (Vec::new(), Vec::new());
    for m in seq(p, "ManagedPolicyArns") {
        match intrinsic(m) {
            Some((n, _)) if n == "Ref" => managed.extend(referenced_id(m)),
            _ => external.push(string_or_sub(m).unwrap_or_else(|| format!("{m:?}"))),
        }
    }
    Ok(RoleDef {
        logical_id: id.to_string(),
        statements: stmts,
        managed_policies: managed,
        external_policies: external,
        conditional_statements: conditional,
    })
}

#[cfg(test)]
mod tests {
    use super::super::parse;
    use super::*;

    #[test]
    fn policy_resources_in_their_forms() {
        let doc = "Statement:\n  - Effect: Allow\n    Action: dynamodb:Query\n    Resource:\n      - !GetAtt T.Arn\n      - !Sub \"${T.Arn}/index/*\"\n      - !If [C, !GetAtt A.Arn, {'Fn::GetAtt': [B, Arn]}]\n      - '*'\n    Condition: {StringEquals: {kms:RequestAlias: alias/x}}\n  - Effect: Deny\n    Principal: {AWS: !GetAtt R.Arn}\n    Action: [kms:Sign]\n";
        let st = policy_document(doc).expect("parses");
        let arn = |id: &str, suffix: &str| ResourceDef::Arn {
            logical_id: id.into(),
            suffix: suffix.into(),
        };
        assert_eq!(st[0].actions, ["dynamodb:Query"]);
        assert_eq!(
            st[0].resources,
            vec![
                arn("T", ""),
                arn("T", "/index/*"),
                ResourceDef::Either(vec![arn("A", ""), arn("B", "")]),
                ResourceDef::Literal("*".into()),
            ]
        );
        assert!(st[0].condition.is_some());
        assert_eq!(st[1].principal, Some(PrincipalDef::Role("R".into())));
        for unsupported in [
            "Statement:\n  - {Effect: Allow, Action: x, Resource: !Sub 'arn:${AWS::Partition}:x:${Y}'}\n",
            "Statement:\n  - {Effect: Allow, Action: x, Resource: !GetAtt Q.QueueName}\n",
            "Statement:\n  - {Effect: Allow, NotAction: x, Resource: '*'}\n",
        ] {
            assert!(policy_document(unsupported).is_err(), "{unsupported}");
        }
    }

    /// `!If [Condition, policy, !Ref AWS::NoValue]` in a role's `Policies`: its statements
    /// hold only with the condition; any other `!If` is refused rather than guessed at.
    #[test]
    fn conditional_policies_of_a_role() {
        let role = |policies: &str| {
            format!(
                "Resources:\n  R:\n    Type: AWS::IAM::Role\n    Properties:\n      Policies:\n{policies}"
            )
        };
        let plain = "        - PolicyName: a\n          PolicyDocument:\n            Statement:\n              - {Effect: Allow, Action: s3:GetObject, Resource: '*'}\n";
        let t = parse(&role(&format!(
            "{plain}        - !If\n          - C\n          - PolicyName: b\n            PolicyDocument:\n              Statement:\n                - {{Effect: Allow, Action: [x:Y], Resource: '*'}}\n          - !Ref AWS::NoValue\n"
        )))
        .expect("parses");
        let r = t.role("R").expect("the role");
        assert_eq!(r.statements.len(), 1);
        assert_eq!(r.statements[0].actions, ["s3:GetObject"]);
        let [(cond, st)] = &r.conditional_statements[..] else {
            panic!("{:?}", r.conditional_statements)
        };
        assert_eq!(
            (cond.as_str(), &st.actions[..]),
            ("C", &["x:Y".to_string()][..])
        );
        let otherwise = role(&format!(
            "        - !If\n          - C\n          - PolicyName: b\n          - PolicyName: c\n{plain}"
        ));
        assert!(parse(&otherwise).is_err());
    }
}
