//! numpy's `np.savez` archives, a zip of `.npy` files (one per array, named `<name>.npy`): the
//! hot rows beside a plan file (1-D integer arrays) and a model's dense weights kept as a store
//! attachment (float32 arrays of any shape). Written as numpy writes them (stored, `.npy`
//! version 1.0, headers padded to 64 bytes); read back from numpy's own files, stored or
//! deflated, any integer type and byte order. Anything else is refused without being read, and a
//! `.npy` that claims more data than it holds is refused before any allocation of the size it
//! claims.

use std::fs::File;
use std::io::{Read, Seek, Write};

use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipArchive, ZipWriter};

const MAGIC: &[u8; 6] = b"\x93NUMPY";
/// numpy aligns the data of a `.npy` to 64 bytes.
const ALIGN: usize = 64;
/// Spare header room numpy leaves for the length of the growth axis.
const GROWTH_AXIS_MAX_DIGITS: usize = 21;

/// A 1-D integer array as stored: signed or unsigned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ints {
    Signed(Vec<i64>),
    Unsigned(Vec<u64>),
}

impl Ints {
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        match self {
            Self::Signed(v) => v.len(),
            Self::Unsigned(v) => v.len(),
        }
    }

    /// As row ids: `Err((position, value))` at the first negative one.
    pub fn into_ids(self) -> Result<Vec<u64>, (usize, i64)> {
        match self {
            Self::Unsigned(v) => Ok(v),
            Self::Signed(v) => match v.iter().position(|&x| x < 0) {
                Some(p) => Err((p, v[p])),
                None => Ok(v.into_iter().map(|x| x as u64).collect()),
            },
        }
    }
}

/// Why an array could not be had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArrayError {
    Unreadable(String),
    NotIntegers { dtype: String, shape: Vec<u64> },
}

/// Writes `arrays` as an `.npz` to `w` (int64, or uint64 where a value needs it).
pub fn write_npz<W: Write + Seek>(w: W, arrays: &[(&str, &[u64])]) -> std::io::Result<()> {
    let mut zip = ZipWriter::new(w);
    for &(name, values) in arrays {
        let signed = values.iter().all(|&v| i64::try_from(v).is_ok());
        let descr = if signed { "<i8" } else { "<u8" };
        let header = npy_header(descr, &[values.len() as u64]);
        let options = SimpleFileOptions::default()
            .compression_method(CompressionMethod::Stored)
            .large_file(header.len() + 8 * values.len() >= u32::MAX as usize);
        zip.start_file(format!("{name}.npy"), options)
            .map_err(std::io::Error::other)?;
        zip.write_all(&header)?;
        let mut data = Vec::with_capacity(8 * values.len());
        for &v in values {
            data.extend_from_slice(&v.to_le_bytes());
        }
        zip.write_all(&data)?;
    }
    zip.finish().map_err(std::io::Error::other)?;
    Ok(())
}

/// numpy's `.npy` version 1.0 header for a C-order array of `shape`.
fn npy_header(descr: &str, shape: &[u64]) -> Vec<u8> {
    let shape = match shape {
        [n] => format!("{n},"),
        dims => dims
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    };
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({shape}), }}");
    dict.push_str(&" ".repeat(GROWTH_AXIS_MAX_DIGITS.saturating_sub(shape.len())));
    let hlen = dict.len() + 1;
    let pad = ALIGN - (MAGIC.len() + 2 + 2 + hlen) % ALIGN;
    let mut out = Vec::with_capacity(10 + hlen + pad);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&((hlen + pad) as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.extend(std::iter::repeat_n(b' ', pad));
    out.push(b'\n');
    out
}

/// An `.npz` archive open for reading.
#[derive(Debug)]
pub struct NpzReader {
    zip: ZipArchive<File>,
}

impl NpzReader {
    pub fn new(file: File) -> Result<Self, String> {
        ZipArchive::new(file)
            .map(|zip| Self { zip })
            .map_err(|e| format!("not an .npz archive: {e}"))
    }

    /// The array `name` (`None`: the archive has none of that name).
    pub fn array(&mut self, name: &str) -> Result<Option<Ints>, ArrayError> {
        let unreadable = |e: &dyn std::fmt::Display| ArrayError::Unreadable(format!("{name}: {e}"));
        let index = match self.zip.index_for_name(&format!("{name}.npy")) {
            Some(i) => i,
            None => return Ok(None),
        };
        let mut member = self.zip.by_index(index).map_err(|e| unreadable(&e))?;
        let mut bytes = Vec::new();
        member.read_to_end(&mut bytes).map_err(|e| unreadable(&e))?;
        parse_npy(&bytes).map(Some).map_err(|e| match e {
            ArrayError::Unreadable(reason) => unreadable(&reason),
            other => other,
        })
    }
}

/// A `.npy` file's 1-D integer array.
pub fn parse_npy(bytes: &[u8]) -> Result<Ints, ArrayError> {
    let bad = |s: String| ArrayError::Unreadable(s);
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(bad("not a .npy array (no numpy magic)".into()));
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (len, start): (usize, usize) = match major {
        1 => (usize::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10),
        2 | 3 if bytes.len() >= 12 => {
            let len = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
            (len as usize, 12)
        }
        2 | 3 => return Err(bad("truncated .npy header".into())),
        _ => return Err(bad(format!(".npy version {major}.{minor}, not 1, 2 or 3"))),
    };
    let header = bytes
        .get(start..start.saturating_add(len))
        .ok_or_else(|| bad("truncated .npy header".into()))?;
    let text: String = if major == 3 {
        std::str::from_utf8(header)
            .map_err(|e| bad(format!(".npy header: {e}")))?
            .to_owned()
    } else {
        header.iter().map(|&b| char::from(b)).collect()
    };
    let (descr, shape, _) =
        crate::pyliteral::npy_header(&text).map_err(|e| bad(format!(".npy header: {e}")))?;
    let dtype = descr.as_deref().and_then(int_dtype);
    let (Some((signed, size, little)), [n]) = (dtype, shape.as_slice()) else {
        return Err(ArrayError::NotIntegers {
            dtype: descr.unwrap_or_else(|| "a structured dtype".into()),
            shape,
        });
    };
    let data = &bytes[start + len..];
    let need = n
        .checked_mul(size as u64)
        .filter(|&b| b <= data.len() as u64);
    let Some(need) = need else {
        return Err(bad(format!(
            "truncated: {n} elements of {size} bytes, {} bytes of data",
            data.len()
        )));
    };
    let words = data[..need as usize].chunks_exact(size);
    let word = |w: &[u8]| -> [u8; 8] {
        // widen to 8 bytes, little-endian, sign-extended where signed
        let mut le = [0u8; 8];
        for (i, &b) in w.iter().enumerate() {
            le[if little { i } else { size - 1 - i }] = b;
        }
        if signed && le[size - 1] & 0x80 != 0 {
            le[size..].fill(0xff);
        }
        le
    };
    Ok(if signed {
        Ints::Signed(words.map(|w| i64::from_le_bytes(word(w))).collect())
    } else {
        Ints::Unsigned(words.map(|w| u64::from_le_bytes(word(w))).collect())
    })
}

/// An integer type string (`<i8`, `|u1`, `>i4`, `=i2`, `i8`): (signed, bytes, little-endian).
fn int_dtype(descr: &str) -> Option<(bool, usize, bool)> {
    let (order, rest) = match descr.chars().next()? {
        c @ ('<' | '>' | '|' | '=') => (c, &descr[1..]),
        _ => ('=', descr),
    };
    let signed = match rest.as_bytes().first()? {
        b'i' => true,
        b'u' => false,
        _ => return None,
    };
    let size: usize = rest[1..]
        .parse()
        .ok()
        .filter(|s| [1, 2, 4, 8].contains(s))?;
    let little = match order {
        '<' => true,
        '>' => false,
        // '|' (not applicable) and '=' are the machine's order, as numpy reads them
        _ => cfg!(target_endian = "little"),
    };
    Some((signed, size, little))
}

/// A float32 array of any shape, C order.
#[derive(Debug, Clone, PartialEq)]
pub struct Floats {
    pub shape: Vec<u64>,
    pub values: Vec<f32>,
}

/// Writes float32 `arrays` (`(name, shape, values)`) as an `.npz` to `w`.
pub fn write_npz_f32<W: Write + Seek>(
    w: W,
    arrays: &[(&str, &[u64], &[f32])],
) -> std::io::Result<()> {
    let mut zip = ZipWriter::new(w);
    for &(name, shape, values) in arrays {
        let n: u64 = shape.iter().product();
        if n != values.len() as u64 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{name}: shape {shape:?} holds {n} values, not {}",
                    values.len()
                ),
            ));
        }
        let header = npy_header("<f4", shape);
        let options = SimpleFileOptions::default()
            .compression_method(CompressionMethod::Stored)
            .large_file(header.len() + 4 * values.len() >= u32::MAX as usize);
        zip.start_file(format!("{name}.npy"), options)
            .map_err(std::io::Error::other)?;
        zip.write_all(&header)?;
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        zip.write_all(&data)?;
    }
    zip.finish().map_err(std::io::Error::other)?;
    Ok(())
}

/// Every float32 array of an `.npz` archive held in memory, by name (arrays of other types are
/// left out); a damaged archive or array is an error naming it.
pub fn read_npz_f32(bytes: &[u8]) -> Result<Vec<(String, Floats)>, String> {
    let mut zip = ZipArchive::new(std::io::Cursor::new(bytes))
        .map_err(|e| format!("not an .npz archive: {e}"))?;
    let mut out = Vec::new();
    for i in 0..zip.len() {
        let mut member = zip.by_index(i).map_err(|e| e.to_string())?;
        let Some(name) = member.name().strip_suffix(".npy").map(str::to_owned) else {
            continue;
        };
        let mut data = Vec::new();
        member
            .read_to_end(&mut data)
            .map_err(|e| format!("{name}: {e}"))?;
        if let Some(floats) = parse_npy_f32(&data).map_err(|e| format!("{name}: {e}"))? {
            out.push((name, floats));
        }
    }
    Ok(out)
}

/// A `.npy` file's float32 array (`None`: another type).
fn parse_npy_f32(bytes: &[u8]) -> Result<Option<Floats>, String> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err("not a .npy array (no numpy magic)".into());
    }
    let (len, start): (usize, usize) = match bytes[6] {
        1 => (usize::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize,
            12,
        ),
        v => return Err(format!(".npy version {v} or a truncated header")),
    };
    let header = bytes
        .get(start..start.saturating_add(len))
        .ok_or("truncated .npy header")?;
    let text: String = header.iter().map(|&b| char::from(b)).collect();
    let (descr, shape, fortran) =
        crate::pyliteral::npy_header(&text).map_err(|e| format!(".npy header: {e}"))?;
    let little = match descr.as_deref() {
        Some("<f4") => true,
        Some(">f4") => false,
        Some("=f4" | "f4") => cfg!(target_endian = "little"),
        _ => return Ok(None),
    };
    if fortran && shape.len() > 1 {
        return Err("a Fortran-order array".into());
    }
    let data = &bytes[start + len..];
    let n = shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .filter(|&n| n.saturating_mul(4) <= data.len() as u64)
        .ok_or_else(|| format!("truncated: shape {shape:?}, {} bytes of data", data.len()))?;
    let values = data[..4 * n as usize]
        .chunks_exact(4)
        .map(|w| {
            let w: [u8; 4] = w.try_into().expect("4 bytes");
            if little {
                f32::from_le_bytes(w)
            } else {
                f32::from_be_bytes(w)
            }
        })
        .collect();
    Ok(Some(Floats { shape, values }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_arrays_round_trip() {
        let (a, b) = ([1.5f32, -2.0, 3.25, 0.0, 7.0, 8.5], [0.25f32]);
        let mut buf = std::io::Cursor::new(Vec::new());
        write_npz_f32(&mut buf, &[("w", &[2, 3], &a), ("b", &[1], &b)]).unwrap();
        let mut got = read_npz_f32(buf.get_ref()).unwrap();
        got.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(got[0].0, "b");
        assert_eq!(
            got[1].1,
            Floats {
                shape: vec![2, 3],
                values: a.to_vec()
            }
        );
        assert!(read_npz_f32(b"PK not a zip").is_err());
    }

    #[test]
    fn headers_are_numpys() {
        let h = npy_header("<i8", &[3]);
        assert_eq!(h.len() % ALIGN, 0);
        let text = String::from_utf8_lossy(&h[10..]);
        assert!(text.starts_with("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }"));
        assert!(text.ends_with(" \n"));
        assert_eq!(
            parse_npy(&h),
            Err(ArrayError::Unreadable(
                "truncated: 3 elements of 8 bytes, 0 bytes of data".into()
            ))
        );
        let mut whole = h.clone();
        whole.extend((1..=3i64).flat_map(|i| i.to_le_bytes()));
        assert_eq!(parse_npy(&whole), Ok(Ints::Signed(vec![1, 2, 3])));
        assert!(matches!(
            parse_npy(&whole[..9]),
            Err(ArrayError::Unreadable(_))
        ));
    }

    #[test]
    fn integer_types_and_byte_orders() {
        assert_eq!(int_dtype("<i8"), Some((true, 8, true)));
        assert_eq!(int_dtype(">u2"), Some((false, 2, false)));
        assert_eq!(int_dtype("|u1"), Some((false, 1, true)));
        assert_eq!(
            int_dtype("|i8"),
            Some((true, 8, cfg!(target_endian = "little")))
        );
        for d in [
            "<f8", "|b1", "<U1", "|S3", "<M8[ns]", "<i3", "", "<c16", "<i",
        ] {
            assert_eq!(int_dtype(d), None, "{d}");
        }
        let mut npy = npy_header("<i8", &[2]);
        npy.truncate(10);
        let dict = "{'descr': '>i2', 'fortran_order': False, 'shape': (3,), }\n";
        npy[8..10].copy_from_slice(&(dict.len() as u16).to_le_bytes());
        npy.extend_from_slice(dict.as_bytes());
        npy.extend_from_slice(&[0xff, 0xfe, 0x00, 0x07, 0x80, 0x00]);
        assert_eq!(parse_npy(&npy), Ok(Ints::Signed(vec![-2, 7, -32768])));
    }

    #[test]
    fn round_trip_through_a_zip() {
        let mut buf = std::io::Cursor::new(Vec::new());
        let big = [u64::MAX, 1];
        write_npz(&mut buf, &[("a", &[5, 0, 9]), ("b/c", &[]), ("big", &big)]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.npz");
        std::fs::write(&path, buf.into_inner()).unwrap();
        let mut r = NpzReader::new(File::open(&path).unwrap()).unwrap();
        assert_eq!(r.array("a").unwrap(), Some(Ints::Signed(vec![5, 0, 9])));
        assert_eq!(r.array("b/c").unwrap(), Some(Ints::Signed(vec![])));
        assert_eq!(r.array("big").unwrap(), Some(Ints::Unsigned(big.to_vec())));
        assert_eq!(r.array("zz").unwrap(), None);
        assert_eq!(Ints::Signed(vec![3, -1]).into_ids(), Err((1, -1)));
    }
}
