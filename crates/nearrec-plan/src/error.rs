use std::path::{Path, PathBuf};

use crate::units::SizeError;

/// What can go wrong generating, reading or writing a trace, planning from one, or reading or
/// writing a plan file.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a valid trace file: {reason}")]
    BadTrace { path: PathBuf, reason: String },
    #[error("table {table:?}: {reason}")]
    BadSpec { table: String, reason: String },
    #[error("{path} already exists (pass overwrite to replace it)")]
    Exists { path: PathBuf },
    #[error(transparent)]
    InsufficientMemory(#[from] nearrec_format::Shortfall),
    /// A trace does not fit the store it is planned for: a table the store lacks, another row
    /// count, or a row id past the table (`position`: where in the table's indices).
    #[error("{reason}")]
    TraceMismatch {
        table: String,
        position: Option<usize>,
        reason: String,
    },
    /// An argument outside its range (such as `steps` of 0).
    #[error("{what} {reason}")]
    InvalidArgument { what: &'static str, reason: String },
    /// A plan file (or the `.hot.npz` archive beside it) that is not a plan; `table` names the
    /// table whose settings are wrong, where one is.
    #[error("{}: {problem}", located(.path, .table.as_deref()))]
    BadPlan {
        path: PathBuf,
        table: Option<String>,
        problem: PlanFileProblem,
    },
    /// A shard plan (`shards.json`) that is not one, or does not fit the shards beside it;
    /// `table` names the table at fault, where one is.
    #[error("{}: {reason}", located(.path, .table.as_deref()))]
    BadShardPlan {
        path: PathBuf,
        table: Option<String>,
        reason: String,
    },
}

/// What is wrong with a plan file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanFileProblem {
    /// Not UTF-8, or not TOML.
    #[error("not a readable plan: {0}")]
    NotToml(String),
    #[error("not a plan: [tables.NAME] must be tables of settings")]
    TablesNotTables,
    #[error("not a plan: hot_rows_file must name the .hot.npz file")]
    NoHotRowsFile,
    /// The archive is missing, not a regular file, not a zip, truncated or corrupted, or one of
    /// its arrays is not a readable `.npy`.
    #[error("the hot rows in {file} are unreadable: {reason}")]
    HotRowsUnreadable { file: String, reason: String },
    #[error("resident must be true or false, not {0}")]
    ResidentNotBool(String),
    #[error("cache_bytes: {0}")]
    CacheBytes(SizeError),
    #[error("hot rows must be a 1-D integer array, not {dtype} of shape {}", tuple(.shape))]
    HotRowsNotIntegers { dtype: String, shape: Vec<u64> },
    #[error("the plan lists {listed} hot rows but the .hot.npz holds {held}")]
    HotRowsCount { listed: i64, held: u64 },
    #[error("hot row {row} at position {position} is negative")]
    NegativeHotRow { row: i64, position: usize },
}

fn located(path: &Path, table: Option<&str>) -> String {
    match table {
        Some(t) => format!("{}: table {t:?}", path.display()),
        None => path.display().to_string(),
    }
}

/// A shape as Python writes a tuple: `(3,)`, `(1, 2)`, `()`.
fn tuple(shape: &[u64]) -> String {
    match shape {
        [n] => format!("({n},)"),
        _ => {
            let parts: Vec<String> = shape.iter().map(u64::to_string).collect();
            format!("({})", parts.join(", "))
        }
    }
}

pub type Result<T, E = PlanError> = std::result::Result<T, E>;

impl PlanError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_file_errors_name_the_file_and_the_table() {
        let e = PlanError::BadPlan {
            path: "p.toml".into(),
            table: Some("t1".into()),
            problem: PlanFileProblem::HotRowsNotIntegers {
                dtype: "<f8".into(),
                shape: vec![2],
            },
        };
        assert_eq!(
            e.to_string(),
            "p.toml: table \"t1\": hot rows must be a 1-D integer array, not <f8 of shape (2,)"
        );
        let e = PlanError::BadPlan {
            path: "p.toml".into(),
            table: None,
            problem: PlanFileProblem::NoHotRowsFile,
        };
        assert!(
            e.to_string()
                .starts_with("p.toml: not a plan: hot_rows_file")
        );
        assert_eq!(tuple(&[1, 2]), "(1, 2)");
        assert_eq!(tuple(&[]), "()");
    }
}
