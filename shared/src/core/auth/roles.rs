//! Permissions, roles with inheritance, and desk scopes.
//!
//! Effective permission = the service token's scopes intersected with the operator's role
//! permissions. The role table is configuration; [`RoleTable::default`] is the contract's
//! hierarchy `viewer < trader < head_trader < admin`.

use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Permission {
    Read,
    Plan,
    Execute,
    Approve,
    Admin,
}

impl Permission {
    /// The OAuth scope that grants it on a service token.
    pub fn scope(self) -> &'static str {
        match self {
            Permission::Read => "trade.read",
            Permission::Plan => "trade.plan",
            Permission::Execute => "trade.execute",
            Permission::Approve => "trade.approve",
            Permission::Admin => "trade.admin",
        }
    }

    pub fn from_scope(s: &str) -> Option<Permission> {
        [
            Permission::Read,
            Permission::Plan,
            Permission::Execute,
            Permission::Approve,
            Permission::Admin,
        ]
        .into_iter()
        .find(|p| p.scope() == s)
    }

    fn from_name(s: &str) -> Option<Permission> {
        Permission::from_scope(s).or_else(|| Permission::from_scope(&format!("trade.{s}")))
    }
}

/// Which desks an operator may see. Applied inside every query, never after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeskScope {
    All,
    Only(BTreeSet<String>),
}

impl DeskScope {
    pub fn allows(&self, desk: &str) -> bool {
        match self {
            DeskScope::All => true,
            DeskScope::Only(d) => d.contains(desk),
        }
    }

    /// A stable text form, bound into cursors so a cursor cannot cross operators' scopes.
    pub fn fingerprint(&self) -> String {
        match self {
            DeskScope::All => "*".into(),
            DeskScope::Only(d) => d.iter().cloned().collect::<Vec<_>>().join(","),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RoleDef {
    pub permissions: BTreeSet<Permission>,
    /// Operators holding this role see every desk.
    pub all_desks: bool,
}

#[derive(Debug, Clone)]
pub struct RoleTable {
    roles: BTreeMap<String, RoleDef>,
}

impl Default for RoleTable {
    fn default() -> Self {
        RoleTable::parse(
            "viewer: read\n\
             trader: inherits viewer, plan, execute\n\
             head_trader: inherits trader, approve, all_desks\n\
             admin: inherits head_trader, admin",
        )
        .expect("the built-in role table parses")
    }
}

impl RoleTable {
    /// One role per line: `name: [inherits parent,] permission, ..., [all_desks]`.
    /// Parents must be defined on an earlier line, so inheritance cannot loop.
    pub fn parse(text: &str) -> Result<RoleTable, String> {
        let mut roles: BTreeMap<String, RoleDef> = BTreeMap::new();
        // Roles are separated by new lines or `;` (one-line form for a CloudFormation parameter).
        for (n, line) in text.split(['\n', ';']).enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, rest) = line
                .split_once(':')
                .ok_or_else(|| format!("role table line {}: expected `name: ...`", n + 1))?;
            let mut def = RoleDef {
                permissions: BTreeSet::new(),
                all_desks: false,
            };
            for item in rest.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                if let Some(parent) = item.strip_prefix("inherits ") {
                    let p = roles.get(parent.trim()).ok_or_else(|| {
                        format!("role table line {}: unknown parent role {parent}", n + 1)
                    })?;
                    def.permissions.extend(p.permissions.iter().copied());
                    def.all_desks |= p.all_desks;
                } else if item == "all_desks" {
                    def.all_desks = true;
                } else {
                    let p = Permission::from_name(item).ok_or_else(|| {
                        format!("role table line {}: unknown permission {item}", n + 1)
                    })?;
                    def.permissions.insert(p);
                }
            }
            roles.insert(name.trim().to_string(), def);
        }
        Ok(RoleTable { roles })
    }

    /// Union of the permissions of the known roles; unknown role names grant nothing.
    pub fn permissions(&self, roles: &[String]) -> BTreeSet<Permission> {
        roles
            .iter()
            .filter_map(|r| self.roles.get(r))
            .flat_map(|d| d.permissions.iter().copied())
            .collect()
    }

    pub fn all_desks(&self, roles: &[String]) -> bool {
        roles
            .iter()
            .filter_map(|r| self.roles.get(r))
            .any(|d| d.all_desks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_inherit() {
        let t = RoleTable::default();
        let p = t.permissions(&["head_trader".into()]);
        assert!(p.contains(&Permission::Read));
        assert!(p.contains(&Permission::Execute));
        assert!(p.contains(&Permission::Approve));
        assert!(!p.contains(&Permission::Admin));
        assert!(t.all_desks(&["head_trader".into()]));
        assert!(!t.all_desks(&["trader".into()]));
        let v = t.permissions(&["viewer".into()]);
        assert_eq!(v.into_iter().collect::<Vec<_>>(), vec![Permission::Read]);
        assert!(t.permissions(&["root".into()]).is_empty());
    }

    #[test]
    fn role_table_rejects_unknown_parent() {
        assert!(RoleTable::parse("a: inherits b").is_err());
        assert!(RoleTable::parse("a: fly").is_err());
    }
}
