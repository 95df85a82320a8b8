//! Errors across the wire. The node answers a failed call with the gRPC status its
//! [`ErrorKind`] maps to and a `google.rpc.ErrorInfo` detail (reason: the kind's name, domain
//! `nearrec`, metadata: `table`, `position`), which stock clients show and nearrec's client turns
//! back into the same typed error a local store raises ([`RemoteError`]). Refusals of the node
//! itself — no token, no grant, a deadline, a full queue — carry no `ErrorInfo` and are known by
//! their code alone.

use std::collections::HashMap;

use nearrec::ErrorKind;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::v1 as pb;

/// The `ErrorInfo` domain of nearrec's errors.
pub const DOMAIN: &str = "nearrec";

/// The status code of each kind of error: what a stock gRPC client (and a retry policy) sees.
pub fn code_of(kind: ErrorKind) -> Code {
    use ErrorKind as K;
    match kind {
        K::InvalidRequest
        | K::IndexOutOfRange
        | K::UnknownKey
        | K::InvalidTrace
        | K::TraceMismatch => Code::InvalidArgument,
        K::UnknownTable | K::StoreNotFound => Code::NotFound,
        K::StoreExists => Code::AlreadyExists,
        K::StoreReadOnly | K::StoreLocked | K::UnsupportedVersion | K::VersionNotServed => {
            Code::FailedPrecondition
        }
        // retryable: compaction frees the delta; memory and threads come back
        K::DeltaFull | K::KeysFull | K::InsufficientMemory | K::ResourceExhausted => {
            Code::ResourceExhausted
        }
        // a concurrency conflict: the sender learns the replicas again and retries
        K::MembershipChanged => Code::Aborted,
        K::StoreIo => Code::Unavailable,
        K::StoreCorrupted => Code::DataLoss,
        K::Internal => Code::Internal,
        K::Unsupported => Code::Unimplemented,
        K::Unauthenticated => Code::Unauthenticated,
        K::PermissionDenied => Code::PermissionDenied,
        K::DeadlineExceeded => Code::DeadlineExceeded,
        K::Overloaded => Code::ResourceExhausted,
        K::Unavailable => Code::Unavailable,
        _ => Code::Unknown,
    }
}

/// The kind of a status that names none (a refusal of the node's own, or the transport's):
/// known by its code alone. The client's own timeout, which tonic answers `CANCELLED`, is a
/// deadline too; a full queue is `Overloaded` (retry), no connection `Unavailable` (retry).
pub fn kind_of_code(code: Code) -> ErrorKind {
    use ErrorKind as K;
    match code {
        Code::Unauthenticated => K::Unauthenticated,
        Code::PermissionDenied => K::PermissionDenied,
        Code::DeadlineExceeded | Code::Cancelled => K::DeadlineExceeded,
        Code::ResourceExhausted => K::Overloaded,
        Code::Unavailable => K::Unavailable,
        Code::InvalidArgument | Code::OutOfRange => K::InvalidRequest,
        Code::NotFound => K::StoreNotFound,
        Code::Unimplemented => K::Unsupported,
        Code::Internal => K::Internal,
        _ => K::Other,
    }
}

fn info(e: &nearrec::Error) -> HashMap<String, String> {
    let mut meta = HashMap::new();
    if let Some(t) = e.table() {
        meta.insert("table".to_owned(), t.to_owned());
    }
    if let Some(p) = e.position() {
        meta.insert("position".to_owned(), p.to_string());
    }
    meta
}

/// A facade error as the status a unary call answers with (an error another node answered
/// with keeps its code).
pub fn status_of(e: &nearrec::Error) -> Status {
    let kind = e.kind();
    let code = match e {
        nearrec::Error::Remote { code, .. } => Code::from_i32(*code),
        _ => code_of(kind),
    };
    Status::with_error_details(
        code,
        e.to_string(),
        ErrorDetails::with_error_info(kind.name(), DOMAIN, info(e)),
    )
}

/// The most bytes of an error's message, and of each name its `ErrorInfo` carries, that cross
/// the wire: a request's names are echoed in its errors, and a status whose headers pass the
/// peer's limit (16 KiB in grpcio) would reach the client as `RESOURCE_EXHAUSTED`, not as the
/// error it is.
pub const MAX_ECHO: usize = 1024;

/// `text` cut to at most `limit` bytes (on a character boundary), saying how long it was.
pub fn clip(text: &str, limit: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= limit {
        return text.into();
    }
    let mut end = limit.saturating_sub(40);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &text[..end], text.len()).into()
}

/// `status` with its message and `ErrorInfo` names clipped to [`MAX_ECHO`] bytes each; the
/// code, kind and position are kept.
pub fn bounded(status: Status) -> Status {
    let remote = RemoteError::from(&status);
    let long = |t: &Option<String>| t.as_ref().is_some_and(|t| t.len() > MAX_ECHO);
    if status.message().len() <= MAX_ECHO && !long(&remote.table) {
        return status;
    }
    let message = clip(&remote.message, MAX_ECHO).into_owned();
    let Some(kind) = remote.kind else {
        return Status::new(status.code(), message);
    };
    let mut meta = HashMap::new();
    if let Some(t) = &remote.table {
        meta.insert("table".to_owned(), clip(t, MAX_ECHO).into_owned());
    }
    if let Some(p) = remote.position {
        meta.insert("position".to_owned(), p.to_string());
    }
    Status::with_error_details(
        status.code(),
        message,
        ErrorDetails::with_error_info(kind.name(), DOMAIN, meta),
    )
}

/// A failed request of a stream, as its answer's error: the status it would have answered
/// with, its `ErrorInfo` unpacked.
pub fn stream_error(status: &Status) -> pb::Error {
    let remote = RemoteError::from(status);
    pb::Error {
        code: status.code() as i32,
        kind: remote.kind.map(|k| k.name().to_owned()).unwrap_or_default(),
        message: remote.message,
        table: remote.table,
        position: remote.position.map(|p| p as u64),
    }
}

/// An error as the node answered it: its code, and where the node named one, the kind of
/// nearrec error with its table and position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteError {
    pub code: Code,
    pub kind: Option<ErrorKind>,
    pub message: String,
    pub table: Option<String>,
    pub position: Option<usize>,
}

impl RemoteError {
    /// The error's kind: the one the node named, else its refusal's by the code
    /// ([`kind_of_code`]).
    pub fn kind(&self) -> ErrorKind {
        self.kind.unwrap_or_else(|| kind_of_code(self.code))
    }

    /// The error's name, as Python's class in `nearrec.errors`.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }
}

/// The node's answer as the facade's error every implementation of the contract returns.
impl From<RemoteError> for nearrec::Error {
    fn from(e: RemoteError) -> Self {
        nearrec::Error::Remote {
            kind: e.kind(),
            code: e.code as i32,
            message: e.message,
            table: e.table,
            position: e.position,
        }
    }
}

impl std::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RemoteError {}

impl From<&Status> for RemoteError {
    fn from(s: &Status) -> Self {
        let info = s.get_details_error_info().filter(|i| i.domain == DOMAIN);
        let (kind, table, position) = match &info {
            Some(i) => (
                ErrorKind::from_name(&i.reason).or(Some(ErrorKind::Other)),
                i.metadata.get("table").cloned(),
                i.metadata.get("position").and_then(|p| p.parse().ok()),
            ),
            None => (None, None, None),
        };
        Self {
            code: s.code(),
            kind,
            message: s.message().to_owned(),
            table,
            position,
        }
    }
}

impl From<&pb::Error> for RemoteError {
    fn from(e: &pb::Error) -> Self {
        Self {
            code: Code::from_i32(e.code),
            kind: (!e.kind.is_empty())
                .then(|| ErrorKind::from_name(&e.kind).unwrap_or(ErrorKind::Other)),
            message: e.message.clone(),
            table: e.table.clone(),
            position: e.position.and_then(|p| usize::try_from(p).ok()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_crosses_the_wire_with_its_kind_table_and_position() {
        let e = nearrec::Error::InvalidRequest {
            table: Some("t1".into()),
            position: Some(7),
            reason: "bad".into(),
        };
        let s = status_of(&e);
        assert_eq!(s.code(), Code::InvalidArgument);
        let back = RemoteError::from(&s);
        assert_eq!(back.kind, Some(ErrorKind::InvalidRequest));
        assert_eq!(back.table.as_deref(), Some("t1"));
        assert_eq!(back.position, Some(7));
        assert_eq!(back.message, e.to_string());
        let streamed = RemoteError::from(&stream_error(&s));
        assert_eq!(streamed, back);
        let refused = RemoteError::from(&stream_error(&Status::resource_exhausted("full")));
        assert_eq!(
            (refused.code, refused.kind),
            (Code::ResourceExhausted, None)
        );
        // a refusal of the node's own carries no kind
        let plain = RemoteError::from(&Status::permission_denied("no"));
        assert_eq!((plain.code, plain.kind), (Code::PermissionDenied, None));
        assert_eq!(plain.name(), "PermissionDenied");
        assert_eq!(back.name(), "InvalidRequest");
        assert_eq!(
            RemoteError::from(&Status::resource_exhausted("full")).name(),
            "Overloaded"
        );
    }

    #[test]
    fn long_names_are_clipped_and_the_error_kept() {
        let name = "n".repeat(100_000);
        let e = nearrec::Error::InvalidRequest {
            table: Some(name.clone()),
            position: Some(3),
            reason: format!("no table {name}"),
        };
        let s = bounded(status_of(&e));
        assert!(s.message().len() <= MAX_ECHO, "{}", s.message().len());
        assert!(s.message().ends_with("bytes in all)"), "{}", s.message());
        let back = RemoteError::from(&s);
        assert_eq!(back.kind, Some(ErrorKind::InvalidRequest));
        assert_eq!(back.position, Some(3));
        assert!(back.table.unwrap().len() <= MAX_ECHO);
        let plain = bounded(Status::not_found(name));
        assert_eq!(
            (plain.code(), plain.message().len() <= MAX_ECHO),
            (Code::NotFound, true)
        );
        // short ones pass untouched; a cut never splits a character
        assert_eq!(bounded(Status::not_found("x")).message(), "x");
        assert!(clip(&"é".repeat(2000), 101).len() <= 101);
    }

    #[test]
    fn every_kind_has_a_name_that_comes_back_and_a_code() {
        for k in ErrorKind::ALL {
            assert_eq!(ErrorKind::from_name(k.name()), Some(k));
            let _ = code_of(k);
        }
        assert_eq!(code_of(ErrorKind::IndexOutOfRange), Code::InvalidArgument);
        assert_eq!(code_of(ErrorKind::DeltaFull), Code::ResourceExhausted);
    }
}
