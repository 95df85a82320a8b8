//! Where a store's DRAM placement and its simulated drive come from ([`PlanSource`],
//! [`DeviceSource`]): each a string (a file, a preset's name) or a table given in place, in
//! TOML and JSON alike.

use std::fmt;
use std::path::{Path, PathBuf};

use nearrec_device::DeviceConfig;
use nearrec_plan::Placement;
use serde::de::{Deserializer, MapAccess, Visitor, value::MapAccessDeserializer};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Where a store's DRAM placement comes from. Written as what it holds (a path, a table); read
/// as either, its refusal saying what either may be.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum PlanSource {
    /// A plan file (`nearrec plan`, `nearrec_plan::Plan::save`).
    File(PathBuf),
    /// A placement given in place.
    Placement(Placement),
}

/// Which simulated drive serves the SSD tier. Written and read as [`PlanSource`] is.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum DeviceSource {
    /// A shipped parameter set (`rm-ssd`, `cosmos-plus`, `this-disk`), or a JSON file of one.
    Preset(String),
    /// A full parameter set.
    Config(Box<DeviceConfig>),
}

impl DeviceSource {
    /// The parameter set, checked.
    pub fn resolve(&self) -> Result<DeviceConfig> {
        let cfg = match self {
            DeviceSource::Preset(name) if DeviceConfig::PRESETS.contains(&name.as_str()) => {
                DeviceConfig::preset(name)?
            }
            DeviceSource::Preset(file) => {
                let path = Path::new(file);
                if !path.exists() {
                    return Err(Error::Config {
                        key: "device".into(),
                        reason: format!(
                            "no device {file:?}: a preset ({}) or a JSON file",
                            DeviceConfig::PRESETS.join(", ")
                        ),
                    });
                }
                let bytes =
                    nearrec_format::files::read_regular(path, 0).map_err(|e| Error::Config {
                        key: "device".into(),
                        reason: format!("{file}: {e}"),
                    })?;
                DeviceConfig::from_json(&String::from_utf8_lossy(&bytes))?
            }
            DeviceSource::Config(cfg) => (**cfg).clone(),
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

impl<'de> Deserialize<'de> for PlanSource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(TextOrTable {
            expecting: "a plan file's path, or a placement: \
                        {tables: {NAME: {resident, hot_rows, cache_bytes}}}",
            text: |v| PlanSource::File(PathBuf::from(v)),
            table: PlanSource::Placement,
        })
    }
}

impl<'de> Deserialize<'de> for DeviceSource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(TextOrTable {
            expecting: "a device preset's name (rm-ssd, cosmos-plus, this-disk), a JSON file, \
                        or a parameter set",
            text: |v| DeviceSource::Preset(v.to_owned()),
            table: |c| DeviceSource::Config(Box::new(c)),
        })
    }
}

/// A setting given as a string (a name, a path) or as a table of type `M`, each made a `T`:
/// how `plan` and `device` read.
struct TextOrTable<M, T> {
    expecting: &'static str,
    text: fn(&str) -> T,
    table: fn(M) -> T,
}

impl<'de, M: Deserialize<'de>, T> Visitor<'de> for TextOrTable<M, T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.expecting)
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<T, E> {
        Ok((self.text)(v))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<T, A::Error> {
        M::deserialize(MapAccessDeserializer::new(map)).map(self.table)
    }
}
