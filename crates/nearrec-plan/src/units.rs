//! Byte sizes as people write them: `"16GiB"`, `"4GB"`, `"512"` (what `nearrec.units` reads in
//! Python, rule for rule): a plain number, optionally with a fraction, then an optional unit,
//! case-insensitive, with blanks around either allowed. Decimal units (`k`, `kb`, `m`, ...) are
//! powers of 1000, binary ones (`kib`, `mib`, ...) powers of 1024; the value is computed in
//! floating point and truncated to whole bytes, as Python does.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The largest size the engine can hold (sizes are signed 64-bit there).
pub const MAX_SIZE: u64 = i64::MAX as u64;

const UNITS: [(&str, u64); 14] = [
    ("", 1),
    ("b", 1),
    ("k", 1_000),
    ("kb", 1_000),
    ("kib", 1 << 10),
    ("m", 1_000_000),
    ("mb", 1_000_000),
    ("mib", 1 << 20),
    ("g", 1_000_000_000),
    ("gb", 1_000_000_000),
    ("gib", 1 << 30),
    ("t", 1_000_000_000_000),
    ("tb", 1_000_000_000_000),
    ("tib", 1 << 40),
];

/// What is wrong with a size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("not a size: {0:?} (try 512MiB, 16GiB)")]
    NotASize(String),
    #[error("not a size: {0} (a bool)")]
    Bool(bool),
    #[error("not a size: {0} (give bytes as an int, or a string such as '512MiB')")]
    NotBytes(String),
    #[error("a size cannot be negative: {0}")]
    Negative(i128),
    #[error("size {0} is too large (at most {MAX_SIZE} bytes)")]
    TooLarge(String),
}

/// Python's `str.isspace` (what `\s` matches in a `str` pattern): Unicode white space and the
/// four ASCII separators `\x1c`..`\x1f`.
fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\x1c'..='\x1f').contains(&c)
}

/// `"16GiB"` → 17179869184; `"4GB"` → 4000000000; `"512"` → 512; `"1.5k"` → 1500.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let not = || SizeError::NotASize(text.to_owned());
    let s = text.trim_matches(is_space);
    let digits_end = s
        .char_indices()
        .find(|&(_, c)| !(c.is_ascii_digit() || c == '.'))
        .map_or(s.len(), |(i, _)| i);
    let (number, rest) = s.split_at(digits_end);
    let unit = rest.trim_start_matches(is_space);
    // the number: digits with an optional fraction, or a fraction alone (one dot at most)
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if (int.is_empty() && frac.is_empty())
        || frac.contains('.')
        || (int.is_empty() && !number.contains('.'))
    {
        return Err(not());
    }
    if !unit.chars().all(|c| c.is_ascii_alphabetic()) {
        return Err(not());
    }
    let scale = UNITS
        .iter()
        .find(|(name, _)| unit.eq_ignore_ascii_case(name))
        .ok_or_else(not)?
        .1;
    let value = number.parse::<f64>().map_err(|_| not())? * scale as f64;
    // Python compares the float with 2**63 - 1 exactly: every float at or past 2**63 is too large
    if !value.is_finite() || value >= 9_223_372_036_854_775_808.0 {
        return Err(SizeError::TooLarge(format!("{text:?}")));
    }
    Ok(value as u64)
}

/// A size given as an integer number of bytes: at least 0, at most [`MAX_SIZE`].
pub fn size_from_int(n: i128) -> Result<u64, SizeError> {
    if n < 0 {
        return Err(SizeError::Negative(n));
    }
    u64::try_from(n)
        .ok()
        .filter(|&n| n <= MAX_SIZE)
        .ok_or_else(|| SizeError::TooLarge(n.to_string()))
}

/// A byte count: an integer, or a string such as `"64MiB"` when read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Size(pub u64);

impl Size {
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl From<u64> for Size {
    fn from(v: u64) -> Self {
        Size(v)
    }
}

impl FromStr for Size {
    type Err = SizeError;

    fn from_str(s: &str) -> Result<Self, SizeError> {
        parse_size(s).map(Size)
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Serialize for Size {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = Size;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size: bytes as an integer, or a string such as \"512MiB\"")
            }

            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Size, E> {
                if v > MAX_SIZE {
                    return Err(E::custom(format!(
                        "size {v} is too large (at most {MAX_SIZE} bytes)"
                    )));
                }
                Ok(Size(v))
            }

            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Size, E> {
                u64::try_from(v)
                    .map(Size)
                    .map_err(|_| E::custom(format!("a size cannot be negative: {v}")))
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Size, E> {
                parse_size(v).map(Size).map_err(E::custom)
            }
        }
        d.deserialize_any(Visit)
    }
}

/// Deserialises a `u64` field as a [`Size`] (`#[serde(deserialize_with = ...)]`).
pub fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    Size::deserialize(d).map(Size::bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_numbers() {
        assert_eq!(parse_size("16GiB"), Ok(16 << 30));
        assert_eq!(parse_size("4GB"), Ok(4_000_000_000));
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size(" 64 mib "), Ok(64 << 20));
        assert_eq!(parse_size("1.5k"), Ok(1_500));
        assert_eq!(parse_size(".5KiB"), Ok(512));
        assert_eq!(parse_size("2."), Ok(2));
        assert_eq!(parse_size("3b"), Ok(3));
        assert_eq!(parse_size("1TiB"), Ok(1 << 40));
        assert_eq!(parse_size("0.3"), Ok(0), "truncated to whole bytes");
        assert_eq!(parse_size("\u{1c}7\u{2003}"), Ok(7), "Python's white space");
    }

    #[test]
    fn what_is_not_a_size() {
        for s in [
            "", " ", "x", "1e3", "-5", "+5", "1.2.3", ".", "5 PB", "5 k b", "١٢", "5ki b",
            "5\u{e9}",
        ] {
            assert_eq!(parse_size(s), Err(SizeError::NotASize(s.into())), "{s:?}");
        }
        assert!(matches!(
            parse_size("8388608TiB"),
            Err(SizeError::TooLarge(_))
        ));
        assert_eq!(parse_size("8388607.99TiB"), Ok(9_223_372_025_859_659_776));
        assert!(matches!(
            parse_size("99999999999999999999999"),
            Err(SizeError::TooLarge(_))
        ));
    }

    #[test]
    fn integers() {
        assert_eq!(size_from_int(0), Ok(0));
        assert_eq!(size_from_int(i128::from(i64::MAX)), Ok(MAX_SIZE));
        assert_eq!(size_from_int(-1), Err(SizeError::Negative(-1)));
        assert!(matches!(
            size_from_int(i128::from(i64::MAX) + 1),
            Err(SizeError::TooLarge(_))
        ));
        assert!(SizeError::Negative(-3).to_string().contains("negative: -3"));
    }
}
