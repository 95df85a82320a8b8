//! Who may do what (RM-SSD's permissioned open): bearer tokens in a call's metadata map to
//! principals through an ACL file, and each principal holds `read`, `write` and `admin` grants
//! on table patterns. The file keeps only each token's SHA-256, never the token.
//!
//! ```toml
//! [principal.ranker]
//! token_sha256 = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"
//! read = ["*"]                       # every table of every store
//!
//! [principal.trainer]
//! token_sha256 = "..."
//! read = ["rmc1/*"]                  # STORE/TABLE; a pattern without "/" is any store's
//! write = ["rmc1/t_user*"]
//! admin = ["rmc1/*"]                 # CreateTable / DropTable of matching names; Swap: "*"
//! weight = 2.0                       # its share of the node's work (default 1; crate::fair)
//! ```
//!
//! A principal's token is rotated without a gap: `token_sha256 = ["OLD", "NEW"]` (either token
//! names it; SIGHUP), clients moved to the new one, then the old hash dropped (SIGHUP again).
//!
//! `*` matches any run of characters. What a call needs is its verb's grant, in the table of
//! verbs (`nearrec_wire::verbs`, shown in `docs/protocol.md`): read, write or admin of each table
//! it names or of every table of the store (a `*` pattern), or any grant on the store. A call
//! with no token is `UNAUTHENTICATED`, one whose token the file does not list too; a grant it
//! lacks is `PERMISSION_DENIED` naming the table.
//! Without an ACL file every call is allowed (the node then listens on loopback only, unless
//! told `--insecure`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use tonic::Status;
use tonic::metadata::MetadataMap;

use nearrec_wire::verbs::Grant;
pub use nearrec_wire::verbs::Permission;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    principal: HashMap<String, PrincipalEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PrincipalEntry {
    token_sha256: Hashes,
    #[serde(default)]
    read: Vec<String>,
    #[serde(default)]
    write: Vec<String>,
    #[serde(default)]
    admin: Vec<String>,
    /// Its share of the node's work against the other principals' with requests waiting
    /// (`crate::fair`): > 0, 1 by default.
    #[serde(default = "one")]
    weight: f64,
}

fn one() -> f64 {
    1.0
}

/// A principal's token hashes: one, or several while a token is rotated.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Hashes {
    One(String),
    Several(Vec<String>),
}

impl Hashes {
    fn all(&self) -> &[String] {
        match self {
            Hashes::One(h) => std::slice::from_ref(h),
            Hashes::Several(hs) => hs,
        }
    }
}

/// One principal's grants.
#[derive(Debug, Clone)]
pub struct Principal {
    pub name: String,
    /// Its share of the node's work (`crate::fair`).
    pub weight: f64,
    read: Vec<Pattern>,
    write: Vec<Pattern>,
    admin: Vec<Pattern>,
}

/// `STORE/TABLE` with `*` wildcards; without a `/`, any store's tables.
#[derive(Debug, Clone)]
struct Pattern {
    store: String,
    table: String,
}

impl Pattern {
    fn parse(text: &str) -> Self {
        match text.split_once('/') {
            Some((s, t)) => Self {
                store: s.to_owned(),
                table: t.to_owned(),
            },
            None => Self {
                store: "*".into(),
                table: text.to_owned(),
            },
        }
    }

    fn matches(&self, store: &str, table: &str) -> bool {
        glob(&self.store, store) && glob(&self.table, table)
    }
}

/// `*` matches any run of characters (none included); everything else itself.
fn glob(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty(); // no `*`: the whole text
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// The ACL: principals by their token's hash.
#[derive(Debug, Clone, Default)]
pub struct Acl {
    by_hash: HashMap<String, Arc<Principal>>,
}

/// A token's SHA-256, as the ACL file writes it (lowercase hex).
pub fn token_hash(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Acl {
    /// Reads and checks an ACL file (every mistake named, nothing half-loaded).
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the ACL {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("the ACL {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut by_hash = HashMap::new();
        for (name, p) in file.principal {
            let patterns = |v: &[String]| v.iter().map(|t| Pattern::parse(t)).collect();
            if !(p.weight > 0.0 && p.weight.is_finite()) {
                return Err(format!(
                    "principal {name:?}: weight is its share of the node's work, a number > 0, \
                     not {}",
                    p.weight
                ));
            }
            let principal = Arc::new(Principal {
                weight: p.weight,
                read: patterns(&p.read),
                write: patterns(&p.write),
                admin: patterns(&p.admin),
                name: name.clone(),
            });
            if p.token_sha256.all().is_empty() {
                return Err(format!("principal {name:?}: token_sha256 names no hash"));
            }
            for given in p.token_sha256.all() {
                let hash = given.to_ascii_lowercase();
                if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!(
                        "principal {name:?}: token_sha256 is 64 hex digits (the SHA-256 of its \
                         token), or a list of them while a token is rotated, not {given:?}"
                    ));
                }
                if let Some(other) = by_hash.insert(hash, principal.clone()) {
                    return Err(format!(
                        "principals {:?} and {name:?} have the same token",
                        other.name
                    ));
                }
            }
        }
        Ok(Self { by_hash })
    }

    /// Principals named (a principal whose token is being rotated has two hashes).
    pub fn principals(&self) -> usize {
        let names: std::collections::HashSet<&str> =
            self.by_hash.values().map(|p| p.name.as_str()).collect();
        names.len()
    }

    /// The principal a call's `authorization: Bearer TOKEN` names.
    pub fn authenticate(&self, metadata: &MetadataMap) -> Result<&Arc<Principal>, Status> {
        let Some(value) = metadata.get("authorization") else {
            return Err(Status::unauthenticated(
                "the node needs a token: send authorization: Bearer TOKEN (Python: \
                 nearrec.connect(..., token= or token_file=), or the NEARREC_TOKEN environment \
                 variable; the command line: --token-file)",
            ));
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .ok_or_else(|| Status::unauthenticated("authorization is not Bearer TOKEN"))?;
        self.by_hash
            .get(&token_hash(token.trim()))
            .ok_or_else(|| Status::unauthenticated("the node does not know this token"))
    }
}

impl Principal {
    /// `PERMISSION_DENIED` unless the principal holds `grant` (a verb's, `nearrec_wire::verbs`)
    /// on `store` for a request naming `tables`.
    pub fn holds<'a>(
        &self,
        grant: Grant,
        store: &str,
        mut tables: impl Iterator<Item = &'a str>,
    ) -> Result<(), Status> {
        match grant {
            Grant::Tables(p) => tables.try_for_each(|t| self.allow(p, store, t)),
            Grant::Store(p) => self.allow_all(p, store),
            Grant::Any => self.allow_any(store),
            Grant::Known => Ok(()),
        }
    }

    fn grants(&self, permission: Permission) -> &[Pattern] {
        match permission {
            Permission::Read => &self.read,
            Permission::Write => &self.write,
            Permission::Admin => &self.admin,
        }
    }

    /// `PERMISSION_DENIED` unless the principal may `permission` table `table` of `store`.
    pub fn allow(&self, permission: Permission, store: &str, table: &str) -> Result<(), Status> {
        if self
            .grants(permission)
            .iter()
            .any(|p| p.matches(store, table))
        {
            return Ok(());
        }
        Err(Status::permission_denied(format!(
            "{:?} may not {} table {table:?} of store {store:?}",
            self.name,
            permission.name()
        )))
    }

    /// `PERMISSION_DENIED` unless the principal may `permission` every table of `store` (a `*`
    /// table pattern).
    pub fn allow_all(&self, permission: Permission, store: &str) -> Result<(), Status> {
        if self
            .grants(permission)
            .iter()
            .any(|p| p.table == "*" && glob(&p.store, store))
        {
            return Ok(());
        }
        Err(Status::permission_denied(format!(
            "{:?} may not {} the whole store {store:?}",
            self.name,
            permission.name()
        )))
    }

    /// `PERMISSION_DENIED` unless the principal holds some grant on `store`.
    pub fn allow_any(&self, store: &str) -> Result<(), Status> {
        let on = |ps: &[Pattern]| ps.iter().any(|p| glob(&p.store, store));
        if on(&self.read) || on(&self.write) || on(&self.admin) {
            return Ok(());
        }
        Err(Status::permission_denied(format!(
            "{:?} holds no grant on store {store:?}",
            self.name
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_written() {
        for (p, t, yes) in [
            ("*", "", true),
            ("*", "anything", true),
            ("t_user*", "t_user_id", true),
            ("t_user*", "t_item", false),
            ("*_id", "user_id", true),
            ("*_id", "user_idx", false),
            ("a*b*c", "a__b__c", true),
            ("a*b*c", "a__c__b", false),
            ("abc", "abc", true),
            ("abc", "abcd", false),
            ("a*a", "a", false),
        ] {
            assert_eq!(glob(p, t), yes, "{p:?} vs {t:?}");
        }
    }

    fn meta(token: Option<&str>) -> MetadataMap {
        let mut m = MetadataMap::new();
        if let Some(t) = token {
            m.insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        m
    }

    #[test]
    fn tokens_map_to_principals_and_grants_to_tables() {
        let acl = Acl::parse(&format!(
            "[principal.ranker]\ntoken_sha256 = \"{}\"\nread = [\"*\"]\n\n\
             [principal.trainer]\ntoken_sha256 = \"{}\"\nread = [\"s/*\"]\n\
             write = [\"s/t_user*\"]\nadmin = [\"s/*\"]\n",
            token_hash("r-token"),
            token_hash("w-token").to_uppercase()
        ))
        .unwrap();
        assert_eq!(acl.principals(), 2);
        let code =
            |r: Result<&Arc<Principal>, Status>| r.map(|p| p.name.clone()).map_err(|s| s.code());
        assert_eq!(
            code(acl.authenticate(&meta(None))),
            Err(tonic::Code::Unauthenticated)
        );
        assert_eq!(
            code(acl.authenticate(&meta(Some("nope")))),
            Err(tonic::Code::Unauthenticated)
        );
        assert_eq!(
            code(acl.authenticate(&meta(Some("r-token")))),
            Ok("ranker".into())
        );
        let ranker = acl.authenticate(&meta(Some("r-token"))).unwrap();
        let trainer = acl.authenticate(&meta(Some("w-token"))).unwrap();
        assert!(ranker.allow(Permission::Read, "any", "t").is_ok());
        let denied = ranker.allow(Permission::Write, "s", "t_user").unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        assert!(
            denied.message().contains("\"t_user\""),
            "{}",
            denied.message()
        );
        assert!(trainer.allow(Permission::Write, "s", "t_user_id").is_ok());
        assert!(trainer.allow(Permission::Write, "s", "t_item").is_err());
        assert!(trainer.allow(Permission::Read, "other", "t_user").is_err());
        assert!(trainer.allow_all(Permission::Admin, "s").is_ok());
        assert!(ranker.allow_all(Permission::Admin, "s").is_err());
        assert!(trainer.allow_any("s").is_ok() && trainer.allow_any("other").is_err());
    }

    /// A token rotated: the old and the new name the principal while both are listed.
    #[test]
    fn a_principal_listed_with_two_hashes_is_named_by_either_token() {
        let acl = Acl::parse(&format!(
            "[principal.ranker]\ntoken_sha256 = [\"{}\", \"{}\"]\nread = [\"*\"]\n",
            token_hash("old"),
            token_hash("new")
        ))
        .unwrap();
        assert_eq!(acl.principals(), 1);
        for token in ["old", "new"] {
            let p = acl.authenticate(&meta(Some(token))).unwrap();
            assert_eq!(p.name, "ranker");
        }
        assert!(acl.authenticate(&meta(Some("other"))).is_err());
        let e = Acl::parse("[principal.a]\ntoken_sha256 = []\n").unwrap_err();
        assert!(e.contains("no hash"), "{e}");
    }

    #[test]
    fn a_malformed_acl_is_refused_whole() {
        for (text, says) in [
            ("[principal.a]\ntoken_sha256 = \"abc\"\n", "64 hex digits"),
            ("[principal.a]\ntoken_sha256 = \"x\"\nreed = []\n", "reed"),
            ("[principal.a]\nread = []\n", "token_sha256"),
        ] {
            let e = Acl::parse(text).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
        let same = format!(
            "[principal.a]\ntoken_sha256 = \"{h}\"\n[principal.b]\ntoken_sha256 = \"{h}\"\n",
            h = token_hash("t")
        );
        assert!(Acl::parse(&same).unwrap_err().contains("same token"));
    }
}
