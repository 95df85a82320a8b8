//! A failed connection in the words of what failed: the address that refused it, the TLS
//! check that did not pass, a node that speaks TLS to a plaintext client or the other way
//! round — never a bare "transport error".

use std::error::Error;

/// Why connecting to (or calling) the node at `addr` failed, from `error` and its sources;
/// `tls` says whether the client spoke TLS.
pub fn describe(addr: &str, tls: bool, error: &(dyn Error + 'static)) -> String {
    let chain = chain(error);
    for cause in &chain {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            if let Some(why) = io_cause(addr, tls, io) {
                return why;
            }
            if let Some(tls_error) = io.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
                return tls_cause(addr, tls_error);
            }
        }
        if let Some(tls_error) = cause.downcast_ref::<rustls::Error>() {
            return tls_cause(addr, tls_error);
        }
    }
    let text: Vec<String> = chain.iter().map(|c| c.to_string()).collect();
    let text = text.join(": ");
    if tls && text.contains("received fatal alert") {
        // the alert arrived after the handshake, inside HTTP/2's error: rustls's words only
        let why = if text.contains("CertificateRequired") {
            "the node wants a client certificate (tls_cert=, tls_key=, --tls-cert, --tls-key)"
        } else {
            "the node refused the handshake"
        };
        return format!("TLS with the node at {addr} failed: {why} ({text})");
    }
    if !tls && text.contains("frame with invalid size") {
        // a TLS record read as an HTTP/2 frame: the node answered a plaintext client in TLS
        return format!(
            "the node at {addr} did not answer in plaintext HTTP/2: it is likely a TLS node; \
             connect with its CA (tls_ca=, --tls-ca) ({text})"
        );
    }
    format!("the connection to the node at {addr} failed: {text}")
}

fn chain<'a>(error: &'a (dyn Error + 'static)) -> Vec<&'a (dyn Error + 'static)> {
    let mut out = vec![error];
    let mut next = error.source();
    while let Some(e) = next {
        out.push(e);
        next = e.source();
    }
    out
}

fn io_cause(addr: &str, tls: bool, io: &std::io::Error) -> Option<String> {
    use std::io::ErrorKind as K;
    Some(match io.kind() {
        K::ConnectionRefused => {
            format!("connection refused at {addr}: no node listens there (is it running?)")
        }
        K::TimedOut => format!("connecting to {addr} timed out: no answer from that address"),
        K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe if tls => format!(
            "the node at {addr} closed the connection as it was made ({io}): a TLS node does \
             that to a client without the certificate it wants (tls_cert=, tls_key=)"
        ),
        K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe => format!(
            "the node at {addr} closed the connection ({io}); if it is a TLS node (which \
             closes a plaintext client's connection), connect with its CA (tls_ca=, --tls-ca)"
        ),
        K::HostUnreachable | K::NetworkUnreachable => format!("{addr} cannot be reached: {io}"),
        K::AddrNotAvailable => format!("{addr} is not an address to connect to: {io}"),
        _ if io.raw_os_error().is_some() => format!("cannot connect to {addr}: {io}"),
        _ => return None,
    })
}

fn tls_cause(addr: &str, e: &rustls::Error) -> String {
    use rustls::{CertificateError as C, Error as E};
    let why = match e {
        E::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => {
            "the node's certificate is not signed by the CA the client trusts (tls_ca=, \
             --tls-ca)"
                .to_owned()
        }
        E::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
            "the node's certificate is not for the name connected to (give the name it holds: \
             tls_domain=)"
                .to_owned()
        }
        E::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
            "the node's certificate has expired".to_owned()
        }
        // webpki's refusal, inside rustls's `Other` (its Display is its name)
        E::InvalidCertificate(C::Other(other)) if other.to_string() == "CaUsedAsEndEntity" => {
            "the node's certificate is a CA certificate (basicConstraints CA:TRUE, as `openssl \
             req -x509` makes by default): sign a leaf certificate for the node with it and \
             serve that (docs/serving.md, \"TLS\")"
                .to_owned()
        }
        E::InvalidMessage(_) => "the node does not speak TLS: it is likely a plaintext node; \
             connect without a CA"
            .to_owned(),
        E::AlertReceived(rustls::AlertDescription::CertificateRequired) => {
            "the node wants a client certificate (tls_cert=, tls_key=, --tls-cert, --tls-key)"
                .to_owned()
        }
        E::AlertReceived(alert) => format!(
            "the node refused the handshake ({alert:?}): it may want a client certificate \
             (tls_cert=, tls_key=) its CA signs"
        ),
        // rustls's own words, once
        _ => return format!("TLS with the node at {addr} failed: {e}"),
    };
    format!("TLS with the node at {addr} failed: {why} ({e})")
}
