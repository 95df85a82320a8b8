//! `KeyIndex` held to a `HashMap` model: inserts, removals and lookups in any order, in indexes
//! small enough that probes overflow, wrap around the end and pass removed slots.

use std::collections::HashMap;

use nearrec_cache::{Inserted, KeyIndex, MISSING};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Insert(u64, u32),
    Remove(u64),
    Get(u64),
}

fn op() -> impl Strategy<Value = Op> {
    // few distinct keys, so that removals and re-inserts meet keys already seen
    let key = prop_oneof![0u64..48, any::<u64>()];
    prop_oneof![
        (key.clone(), 1u32..1000).prop_map(|(k, r)| Op::Insert(k, r)),
        key.clone().prop_map(Op::Remove),
        key.prop_map(Op::Get),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn an_index_answers_as_a_map_does(
        sized_for in 1u64..40,
        seed in any::<u64>(),
        ops in proptest::collection::vec(op(), 1..300),
    ) {
        let mut ix = KeyIndex::with_seed(sized_for, seed);
        let mut model: HashMap<u64, u32> = HashMap::new();
        for op in ops {
            match op {
                Op::Insert(k, r) => match ix.insert(k, r) {
                    Ok(Inserted::New) => {
                        prop_assert!(model.insert(k, r).is_none());
                    }
                    Ok(Inserted::Present(old)) => prop_assert_eq!(model.get(&k), Some(&old)),
                    Err(full) => {
                        prop_assert!(!model.contains_key(&k));
                        prop_assert_eq!(full.keys, model.len() as u64);
                    }
                },
                Op::Remove(k) => prop_assert_eq!(ix.remove(k), model.remove(&k)),
                Op::Get(k) => prop_assert_eq!(ix.get(k), model.get(&k).copied()),
            }
            prop_assert_eq!(ix.len(), model.len() as u64);
        }
        let mut held: Vec<(u64, u32)> = ix.iter().collect();
        let mut want: Vec<(u64, u32)> = model.into_iter().collect();
        held.sort_unstable();
        want.sort_unstable();
        prop_assert_eq!(&held, &want);
        let keys: Vec<u64> = want.iter().map(|&(k, _)| k).chain([u64::MAX - 1]).collect();
        let mut rows = vec![0; keys.len()];
        ix.get_many(&keys, &mut rows);
        for (k, r) in keys.iter().zip(&rows) {
            let held = want.iter().find(|w| w.0 == *k).map_or(MISSING, |w| w.1);
            prop_assert_eq!(*r, held);
        }
    }
}
