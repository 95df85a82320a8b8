//! The table of verbs against the protocols themselves: every RPC of the proto's `Node` service
//! and of the Open Inference Protocol's `GRPCInferenceService` has exactly one row and every row
//! an RPC; every step of a `Transaction` exactly one row; and
//! `docs/protocol.md` shows the table as it is.

use std::collections::BTreeMap;

use nearrec_wire::v1::FILE_DESCRIPTOR_SET;
use nearrec_wire::verbs::{self, VERBS};
use prost::Message as _;
use prost_types::FileDescriptorSet;

/// The RPCs of `Node` and `GRPCInferenceService`, and `TransactionRequest.Step`'s values, as
/// the descriptors have them.
fn proto() -> (Vec<String>, Vec<(String, i32)>) {
    let fds = FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).expect("the descriptor set decodes");
    let service = |package: &str, name: &str| {
        let file = (fds.file.iter())
            .find(|f| f.package() == package)
            .unwrap_or_else(|| panic!("{package} is compiled"));
        let service = (file.service.iter())
            .find(|s| s.name() == name)
            .unwrap_or_else(|| panic!("the {name} service"));
        service
            .method
            .iter()
            .map(|m| m.name().to_owned())
            .collect::<Vec<_>>()
    };
    let mut rpcs = service("nearrec.v1", "Node");
    let oip = service("inference", "GRPCInferenceService");
    assert_eq!(oip.len(), 6, "{oip:?}");
    rpcs.extend(oip);
    let file = (fds.file.iter())
        .find(|f| f.package() == "nearrec.v1")
        .expect("nearrec.v1 is compiled");
    let transaction = (file.message_type.iter())
        .find(|m| m.name() == "TransactionRequest")
        .expect("TransactionRequest");
    let step = (transaction.enum_type.iter())
        .find(|e| e.name() == "Step")
        .expect("TransactionRequest.Step");
    let steps = (step.value.iter())
        .map(|v| (v.name().to_owned(), v.number()))
        .collect();
    (rpcs, steps)
}

/// Problems between `rows` (each row's RPC and step number) and the proto's RPCs and steps.
fn mismatches(
    rows: &[(&str, Option<i32>)],
    rpcs: &[String],
    steps: &[(String, i32)],
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut count: BTreeMap<(&str, Option<i32>), usize> = BTreeMap::new();
    for &(rpc, step) in rows {
        *count.entry((rpc, step)).or_default() += 1;
        if !rpcs.iter().any(|r| r == rpc) {
            problems.push(format!("row {rpc} names no RPC of the proto"));
        }
        if let Some(n) = step
            && (rpc != "Transaction" || !steps.iter().any(|(_, v)| *v == n))
        {
            problems.push(format!("row {rpc} step {n} names no step of the proto"));
        }
    }
    let wanted = (rpcs.iter().map(|r| (r.as_str(), None)))
        .chain(steps.iter().map(|(_, n)| ("Transaction", Some(*n))));
    for key in wanted {
        match count.get(&key).copied().unwrap_or(0) {
            1 => {}
            0 => problems.push(format!("{key:?} has no row")),
            n => problems.push(format!("{key:?} has {n} rows")),
        }
    }
    problems
}

fn rows() -> Vec<(&'static str, Option<i32>)> {
    VERBS
        .iter()
        .map(|v| (v.rpc, v.step.map(|s| s as i32)))
        .collect()
}

#[test]
fn every_rpc_and_transaction_step_has_exactly_one_row() {
    let (rpcs, steps) = proto();
    assert!(rpcs.len() >= 14 && steps.len() >= 9, "{rpcs:?} {steps:?}");
    let problems = mismatches(&rows(), &rpcs, &steps);
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn the_check_fails_on_a_row_removed_or_an_rpc_added() {
    let (rpcs, steps) = proto();
    for k in 0..VERBS.len() {
        let mut fewer = rows();
        let gone = fewer.remove(k);
        let problems = mismatches(&fewer, &rpcs, &steps);
        assert!(!problems.is_empty(), "without {gone:?} nothing failed");
    }
    let mut more = rpcs.clone();
    more.push("Cursor".to_owned());
    assert_eq!(
        mismatches(&rows(), &more, &steps),
        ["(\"Cursor\", None) has no row"]
    );
    let mut stray = rows();
    stray.push(("Lookup", Some(1)));
    assert!(!mismatches(&stray, &rpcs, &steps).is_empty());
}

#[test]
fn the_protocol_doc_shows_the_table_as_it_is() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/protocol.md"
    ))
    .expect("docs/protocol.md");
    let table = verbs::markdown();
    assert!(
        doc.contains(&table),
        "docs/protocol.md's table of verbs is not the table's (crates/nearrec-wire/src/verbs.rs); \
         it should read:\n{table}"
    );
}
