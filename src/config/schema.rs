//! The keys each table of the config file takes, read once from the serde derives of
//! [`super::file`], so that the file layer's structs stay the one description of the file.
//!
//! [`super::document`] walks a file's text against it: every unknown key is reported (with the
//! nearest known one), and every `*_ms` key gets its duration sibling (`read_timeout = "2s"`
//! beside `read_timeout_ms = 2000`) with nothing to declare but the `_ms` field itself. A test
//! holds docs/configuration.md to it, so no key goes undocumented.
//!
//! How: a [`FileConfig`] is deserialized from a probe that answers every struct with each of
//! its own fields and every other value with a placeholder, noting the fields of each struct
//! under its table path (`auth.agents[]` for the tables of an array).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::de::value::{Error, StrDeserializer};
use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::file::{AgentsFile, FileConfig};

/// The suffix of the keys that take milliseconds, each of which also takes its name without
/// it and a duration string.
pub const MS_SUFFIX: &str = "_ms";

/// The keys of each table of a file, by table path (`""` for the top, `auth.agents[]` for each
/// `[[auth.agents]]`).
#[derive(Debug)]
pub struct Schema {
    tables: BTreeMap<String, &'static [&'static str]>,
}

impl Schema {
    /// The schema of [`FileConfig`], read on first use.
    pub fn file() -> &'static Schema {
        static SCHEMA: OnceLock<Schema> = OnceLock::new();
        SCHEMA.get_or_init(Self::of::<FileConfig>)
    }

    /// The schema of the agents file ([`AgentsFile`]), read on first use.
    pub fn agents_file() -> &'static Schema {
        static SCHEMA: OnceLock<Schema> = OnceLock::new();
        SCHEMA.get_or_init(Self::of::<AgentsFile>)
    }

    fn of<'de, T: Deserialize<'de>>() -> Schema {
        let mut tables = BTreeMap::new();
        T::deserialize(Probe {
            path: String::new(),
            tables: &mut tables,
        })
        .expect("the probe answers every type the file layer uses");
        Schema { tables }
    }

    /// The keys the table at `path` takes; `None` when `path` is no table.
    pub fn keys(&self, path: &str) -> Option<&'static [&'static str]> {
        self.tables.get(path).copied()
    }

    /// Whether a table of the file has a key named `name`.
    pub fn names_key(&self, name: &str) -> bool {
        self.tables.values().any(|fields| fields.contains(&name))
    }

    /// Every key a file can set, by its full path (`upstream.read_timeout_ms`,
    /// `auth.agents[].id`), tables themselves left out.
    pub fn every_key(&self) -> Vec<String> {
        let mut keys = Vec::new();
        for (table, fields) in &self.tables {
            for field in *fields {
                let path = join(table, field);
                let is_table = self.tables.contains_key(&path)
                    || self.tables.contains_key(&format!("{path}[]"));
                if !is_table {
                    keys.push(path);
                }
            }
        }
        keys
    }
}

/// `table.key`, or `key` at the top.
pub fn join(table: &str, key: &str) -> String {
    if table.is_empty() {
        key.to_owned()
    } else {
        format!("{table}.{key}")
    }
}

/// A deserializer that answers a struct with its own fields and any other value with a
/// placeholder of the type asked for, noting each struct's fields under its path.
struct Probe<'a> {
    path: String,
    tables: &'a mut BTreeMap<String, &'static [&'static str]>,
}

/// Integers of every width are 0.
macro_rules! zero {
    ($($method:ident)*) => {
        $(fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
            visitor.visit_u64(0)
        })*
    };
}

impl<'de> de::Deserializer<'de> for Probe<'_> {
    type Error = Error;

    /// A value the file may write in more than one shape (`token_sha256`: one digest or a
    /// list) is a leaf: a string stands for it.
    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_str("")
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.tables.insert(self.path.clone(), fields);
        visitor.visit_map(Fields {
            path: self.path,
            fields: fields.iter(),
            current: "",
            tables: self.tables,
        })
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_some(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_seq(OneElement(Some(Probe {
            path: format!("{}[]", self.path),
            tables: self.tables,
        })))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        let first: StrDeserializer<Error> = variants[0].into_deserializer();
        visitor.visit_enum(first)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_bool(false)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_f64(0.0)
    }

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_f64(0.0)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_str("")
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_str("")
    }

    zero!(deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64 deserialize_i8
          deserialize_i16 deserialize_i32 deserialize_i64);

    serde::forward_to_deserialize_any! {
        char bytes byte_buf unit unit_struct newtype_struct tuple tuple_struct map identifier
        ignored_any
    }
}

/// A struct's fields, each with a probe for its value.
struct Fields<'a> {
    path: String,
    fields: std::slice::Iter<'static, &'static str>,
    current: &'static str,
    tables: &'a mut BTreeMap<String, &'static [&'static str]>,
}

impl<'de> MapAccess<'de> for Fields<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some(&field) = self.fields.next() else {
            return Ok(None);
        };
        self.current = field;
        let key: StrDeserializer<Error> = field.into_deserializer();
        seed.deserialize(key).map(Some)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, Error> {
        seed.deserialize(Probe {
            path: join(&self.path, self.current),
            tables: self.tables,
        })
    }
}

/// A sequence of one probed element.
struct OneElement<'a>(Option<Probe<'a>>);

impl<'de> SeqAccess<'de> for OneElement<'_> {
    type Error = Error;

    fn next_element_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, Error> {
        self.0
            .take()
            .map(|probe| seed.deserialize(probe))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_has_every_table_and_key_of_the_file() {
        let schema = Schema::file();
        assert!(schema.keys("").unwrap().contains(&"retirement"));
        assert!(schema
            .keys("upstream")
            .unwrap()
            .contains(&"read_timeout_ms"));
        assert!(schema.keys("auth.agents[]").unwrap().contains(&"sunset_at"));
        assert!(schema
            .keys("retirement.brownouts[]")
            .unwrap()
            .contains(&"percent_end"));
        assert_eq!(schema.keys("upstream.addresses"), None);
        let keys = schema.every_key();
        for key in [
            "listen.proxy",
            "auth.agents[].services",
            "tracing.export_timeout_ms",
        ] {
            assert!(keys.iter().any(|k| k == key), "{key} missing: {keys:?}");
        }
        assert!(!keys.iter().any(|k| k == "auth" || k == "auth.agents"));
        // One digest or a list is one key; the tokens' table has its own.
        assert!(keys.iter().any(|k| k == "auth.agents[].token_sha256"));
        assert!(keys.iter().any(|k| k == "auth.agents[].tokens[].not_after"));
        let agents = Schema::agents_file();
        assert_eq!(agents.keys("agents[]"), schema.keys("auth.agents[]"));
    }
}
