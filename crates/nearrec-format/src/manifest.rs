//! The store manifest: a checksummed binary envelope around a JSON body.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::keys::KeysMeta;
use crate::layout::RowLayout;
use crate::order::OrderMeta;
use crate::sums::SumsMeta;

pub const MANIFEST_FILE: &str = "MANIFEST";
pub const MANIFEST_MAGIC: [u8; 8] = *b"NRSTORE\0";
/// The newest format version this build reads and writes: version 9's write-ahead log holds
/// the steps of cross-shard writes (operation kinds 10 and 11: a share prepared, a decision),
/// which an older reader would take for a damaged record. Version 8's
/// write-ahead log tells
/// the keys a keyed table evicted or let expire from the ones a caller removed (operation kinds
/// 8 and 9, which an older reader would take for a damaged record). Version 7 has applied delta
/// feeds
/// (its write-ahead log holds their cursors, [`FeedCursor`], which an older reader would take
/// for a damaged record). Version 6 has tables of int4, int2
/// or fp8 rows (dtype codes an older reader does not know). Version 5 has keyed tables
/// ([`KeysMeta`]: rows addressed by raw 64-bit keys, which an older reader would serve by
/// position). Version 4 is a live store's (its
/// manifest records the log sequence number its tables hold, and the write-ahead log beside
/// them holds the writes after it: an older reader, which would ignore the log, refuses it).
/// Version 3 added sector checksums ([`crate::SectorSums`]), which every store written since
/// has. Version 2 (row orders, attachments) and version 1 stores keep opening, without sector
/// checks ("unprotected").
pub const FORMAT_VERSION: u32 = 9;
/// The version of a store whose log may hold a cross-shard write's steps.
pub const TXN_VERSION: u32 = 9;
/// The version of a store whose keyed tables let keys go of themselves (kinds 8 and 9).
pub const RELEASES_VERSION: u32 = 8;
/// The version of a store that has applied a delta feed (its log may hold cursors).
pub const FEEDS_VERSION: u32 = 7;
/// The version of a store with tables of int4, int2 or fp8 rows and no feed.
const NBIT_VERSION: u32 = 6;
/// The version of a store with keyed tables and only the dtypes of version 1.
const KEYED_VERSION: u32 = 5;
/// The version of a live store without keyed tables.
const LIVE_VERSION: u32 = 4;
/// The version of a store with sector checksums that is not live.
const SUMS_VERSION: u32 = 3;
/// The version of a store with row orders or attachments but no sector checksums.
const ORDERS_VERSION: u32 = 2;
/// The version of a store without row orders.
const PLAIN_VERSION: u32 = 1;
const ENVELOPE_BYTES: usize = 32;

/// One table as the manifest records it. The table file's header repeats the layout fields; the
/// reader requires both to agree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableMeta {
    pub name: String,
    /// File name relative to the store directory.
    pub file: String,
    pub rows: u64,
    pub dim: u32,
    pub dtype: DType,
    pub row_bytes: u64,
    pub block_bytes: u32,
    pub data_bytes: u64,
    /// CRC-32C of the data region, as also stored in the table header.
    pub data_crc32c: u32,
    /// Where the rows sit when the table is co-located (format version 2); `None`: row `r` at
    /// slot `r`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<OrderMeta>,
    /// The sector checksums of the data region (format version 3); `None`: the table is
    /// unprotected on the read path (an older store).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sums: Option<SumsMeta>,
    /// A keyed table's keys file (format version 5): each key with its row (row 0 holds
    /// zeros); `None`: rows are addressed by position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<KeysMeta>,
    /// How far the stored rows are from the float rows they were built from, when the builder
    /// encoded them (a lossy dtype); `None`: stored exactly, or given already encoded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quant_error: Option<QuantError>,
}

/// The encoding error of a table's rows against the float rows they were built from.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct QuantError {
    /// The largest absolute difference of one value.
    pub max_abs: f32,
    /// The mean absolute difference over every value encoded.
    pub mean_abs: f64,
    /// How many values were encoded.
    pub values: u64,
}

impl TableMeta {
    pub fn layout(&self) -> RowLayout {
        RowLayout::new(self.rows, self.row_bytes, u64::from(self.block_bytes))
    }

    /// Whether rows are addressed by keys.
    pub fn is_keyed(&self) -> bool {
        self.keys.is_some()
    }

    /// The keys a keyed table holds, or the rows of another.
    pub fn entries(&self) -> u64 {
        self.keys.as_ref().map_or(self.rows, |k| k.count)
    }

    /// Every file of the store's directory the table is made of: its data, sector sums, row
    /// order and keys.
    pub fn files(&self) -> impl Iterator<Item = &str> {
        [
            Some(&self.file),
            self.sums.as_ref().map(|s| &s.file),
            self.order.as_ref().map(|o| &o.file),
            self.keys.as_ref().map(|k| &k.file),
        ]
        .into_iter()
        .flatten()
        .map(String::as_str)
    }
}

/// How the manifest lists one attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    pub name: String,
    /// File name relative to the store directory.
    pub file: String,
    pub bytes: u64,
    pub crc32c: u32,
}

/// The decoded manifest body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    /// The writing software, e.g. `nearrec 0.1.0`.
    pub created_by: String,
    /// How the store was made (source, model, seed, ...): free-form, recorded for reproducibility.
    #[serde(default)]
    pub params: serde_json::Value,
    pub tables: Vec<TableMeta>,
    /// Named blobs kept with the tables (version 2), e.g. a model's dense weights.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
    /// A live store's (version 4): the last write-ahead log record its tables hold; the log's
    /// later records are replayed on top of them at open. `None`: not live (no log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lsn: Option<u64>,
    /// The delta feeds applied to the store (version 7), each with the last delta it applied
    /// as of `lsn` (the log's later records move them on).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub feeds: BTreeMap<String, FeedCursor>,
}

/// Where a delta feed stands in a store: the last delta file it applied (`docs/format.md`
/// §17), kept in the same log record as that file's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FeedCursor {
    /// The file's sequence number.
    pub sequence: u64,
    /// The producer's training step, if the file said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// The producer's wall time when it wrote the file (ms since the Unix epoch), if it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_time_ms: Option<u64>,
    /// The store's wall time when it logged the file's rows (ms since the Unix epoch).
    pub applied_ms: u64,
    /// The file's rows.
    pub rows: u64,
}

impl Manifest {
    /// The oldest format version that can describe this manifest.
    pub fn needed_version(&self) -> u32 {
        if !self.feeds.is_empty() {
            FEEDS_VERSION
        } else if self.tables.iter().any(|t| t.dtype.since_version() > 1) {
            NBIT_VERSION
        } else if self.tables.iter().any(TableMeta::is_keyed) {
            KEYED_VERSION
        } else if self.lsn.is_some() {
            LIVE_VERSION
        } else if self.tables.iter().any(|t| t.sums.is_some()) {
            SUMS_VERSION
        } else if self.tables.iter().any(|t| t.order.is_some()) || !self.attachments.is_empty() {
            ORDERS_VERSION
        } else {
            PLAIN_VERSION
        }
    }

    /// Encodes the manifest: 32-byte envelope (magic, version, body length, body CRC-32C) + JSON.
    pub fn encode(&self) -> Vec<u8> {
        let body = serde_json::to_vec_pretty(self).expect("manifest serialises");
        let mut out = Vec::with_capacity(ENVELOPE_BYTES + body.len());
        out.extend_from_slice(&MANIFEST_MAGIC);
        out.extend_from_slice(&self.format_version.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes()); // flags, reserved
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes()); // reserved
        out.extend_from_slice(&body);
        out
    }

    /// Decodes a manifest. `Err(Ok(version))` is a well-formed manifest of an unsupported version;
    /// `Err(Err(reason))` is corruption.
    pub fn decode(b: &[u8]) -> Result<Self, Result<u32, String>> {
        if b.len() < ENVELOPE_BYTES {
            return Err(Err(format!(
                "manifest is {} bytes, shorter than its envelope",
                b.len()
            )));
        }
        if b[0..8] != MANIFEST_MAGIC {
            return Err(Err("bad manifest magic (not a nearrec store)".into()));
        }
        let version = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        if version == 0 || version > FORMAT_VERSION {
            return Err(Ok(version));
        }
        let len = u64::from_le_bytes(b[16..24].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(b[24..28].try_into().expect("4 bytes"));
        let body = &b[ENVELOPE_BYTES..];
        if body.len() as u64 != len {
            return Err(Err(format!(
                "manifest body is {} bytes, envelope says {len}",
                body.len()
            )));
        }
        let actual = crc32c::crc32c(body);
        if actual != crc {
            return Err(Err(format!(
                "manifest checksum mismatch (stored {crc:#010x}, computed {actual:#010x})"
            )));
        }
        let m: Manifest = serde_json::from_slice(body)
            .map_err(|e| Err(format!("manifest body is not valid: {e}")))?;
        if m.format_version != version {
            return Err(Err(format!(
                "manifest body says version {}, envelope says {version}",
                m.format_version
            )));
        }
        if version < m.needed_version() {
            return Err(Err(format!(
                "a version-{version} manifest cannot name what it names (row orders and \
                 attachments need version 2, sector checksums version 3, a log position 4, keyed tables 5)"
            )));
        }
        Ok(m)
    }

    pub fn table_index(&self, name: &str) -> Option<usize> {
        self.tables.iter().position(|t| t.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            format_version: PLAIN_VERSION,
            created_by: "test".into(),
            params: serde_json::json!({"seed": 3}),
            tables: vec![TableMeta {
                name: "t0".into(),
                file: "table-0000.nrt".into(),
                rows: 10,
                dim: 4,
                dtype: DType::Fp16,
                row_bytes: 8,
                block_bytes: 4096,
                data_bytes: 4096,
                data_crc32c: 7,
                order: None,
                sums: None,
                keys: None,
                quant_error: None,
            }],
            attachments: Vec::new(),
            lsn: None,
            feeds: Default::default(),
        }
    }

    #[test]
    fn round_trip_and_corruption() {
        let m = sample();
        let b = m.encode();
        assert_eq!(Manifest::decode(&b).unwrap(), m);
        let mut bad = b.clone();
        let n = bad.len();
        bad[n - 3] ^= 1;
        assert!(matches!(Manifest::decode(&bad), Err(Err(_))));
        assert!(matches!(Manifest::decode(&b[..b.len() - 1]), Err(Err(_))));
        let mut future = b.clone();
        future[8..12].copy_from_slice(&99u32.to_le_bytes());
        assert_eq!(Manifest::decode(&future), Err(Ok(99)));
    }

    #[test]
    fn sector_sums_need_version_3() {
        let mut m = sample();
        m.tables[0].sums = Some(SumsMeta {
            file: "table-0000.sums".into(),
            crc32c: 1,
        });
        m.format_version = 2;
        assert!(matches!(Manifest::decode(&m.encode()), Err(Err(_))));
        m.format_version = m.needed_version();
        assert_eq!(m.format_version, 3);
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
    }

    #[test]
    fn a_log_position_needs_version_4() {
        let mut m = sample();
        m.lsn = Some(0);
        m.format_version = 3;
        assert!(matches!(Manifest::decode(&m.encode()), Err(Err(_))));
        m.format_version = m.needed_version();
        assert_eq!(m.format_version, 4);
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
    }

    #[test]
    fn keyed_tables_need_version_5() {
        let mut m = sample();
        m.lsn = Some(3);
        m.tables[0].keys = Some(KeysMeta {
            file: "table-0000.keys".into(),
            crc32c: 5,
            count: 9,
            default: false,
        });
        m.format_version = 4;
        assert!(matches!(Manifest::decode(&m.encode()), Err(Err(_))));
        m.format_version = m.needed_version();
        assert_eq!(m.format_version, 5);
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
        assert_eq!(m.tables[0].entries(), 9);
        assert_eq!(
            m.tables[0].files().collect::<Vec<_>>(),
            ["table-0000.nrt", "table-0000.keys"]
        );
    }

    #[test]
    fn new_dtypes_need_version_6() {
        for dtype in [DType::Int4, DType::Int2, DType::Fp8] {
            let mut m = sample();
            m.tables[0].dtype = dtype;
            m.format_version = 5;
            assert!(matches!(Manifest::decode(&m.encode()), Err(Err(_))));
            m.format_version = m.needed_version();
            assert_eq!(m.format_version, 6);
            assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
        }
        let mut m = sample();
        m.tables[0].quant_error = Some(QuantError {
            max_abs: 0.5,
            mean_abs: 0.125,
            values: 40,
        });
        // an fp16 table with its error recorded needs no new reader
        assert_eq!(m.needed_version(), 1);
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
    }

    #[test]
    fn row_orders_need_version_2() {
        let mut m = sample();
        m.tables[0].order = Some(OrderMeta {
            file: "table-0000.order".into(),
            crc32c: 1,
        });
        // a version-1 envelope around an order is refused ...
        assert!(matches!(Manifest::decode(&m.encode()), Err(Err(_))));
        // ... a version-2 one is read back whole
        m.format_version = m.needed_version();
        assert_eq!(m.format_version, 2);
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
        // and plain stores stay version 1, so older readers keep opening them
        assert_eq!(sample().needed_version(), 1);
        let mut with_blob = sample();
        with_blob.attachments.push(Attachment {
            name: "dense.npz".into(),
            file: "attach-0000-dense.npz".into(),
            bytes: 3,
            crc32c: 9,
        });
        assert!(matches!(Manifest::decode(&with_blob.encode()), Err(Err(_))));
        with_blob.format_version = with_blob.needed_version();
        assert_eq!(Manifest::decode(&with_blob.encode()).unwrap(), with_blob);
    }
}
