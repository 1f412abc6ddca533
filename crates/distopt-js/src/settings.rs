//! Settings and options objects (`new Trainer(settings)`; the options of `Join`, ZeRO,
//! `DistributedOptimizer` and `World.joinNats`) read as serde types. Each is a struct that
//! declares every key once, with its Rust type, whether it may be left out, and its doc: serde
//! reads it, and tsify writes its TypeScript interface into `index.d.ts` from the same
//! declaration.
//!
//! [`read`] is the deserializer they are read with. It reads the object's JSON form
//! (`convert::json_from_js`, which keeps JS's numbers as they are) and reports what is wrong
//! with the library's typed errors, naming the key the way the caller's messages do
//! ([`Naming`]): an unknown key (found before any value is read), a missing one, or a value of
//! the wrong kind (a `TypeError`; a negative count is a `ValueError`).

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, Visitor};
use serde_json::{Map, Value};
use wasm_bindgen::JsValue;

use super::convert::json_from_js;

use distopt::error::{Error, Result};
use distopt::json::number_from_json;

/// How one reader's messages name what is wrong.
pub(crate) struct Naming {
    /// The top-level object, as unknown-key messages name it (`Trainer`, `Join`).
    pub(crate) name: &'static str,
    /// A key as messages name it: `'period'`, `options.enable`.
    pub(crate) key: fn(&str) -> String,
    /// The message for the unknown key `key` of `object` (the top-level name, or the key that
    /// holds a nested object), given the keys it knows.
    pub(crate) unknown: fn(object: &str, key: &str, known: &[&str]) -> String,
    /// The message for a required key left out.
    pub(crate) missing: fn(&str) -> String,
}

/// Reads `value` (an object's JSON form) as `T`, with `naming`'s messages.
pub(crate) fn read<T: DeserializeOwned>(value: &Value, naming: &Naming) -> Result<T> {
    CARRIED.with(|carried| carried.borrow_mut().take());
    T::deserialize(Reader {
        value,
        key: None,
        object: naming.name,
        naming,
    })
    .map_err(|failure| match failure {
        Failure::Error(error) => error,
        Failure::Missing(key) => Error::type_error((naming.missing)(key)),
        Failure::Serde(message) => Error::type_error(message),
    })
}

/// A JS options object read as `T` (its JSON form, `what` naming it there), or `None` for
/// `undefined` or `null`; anything but an object is the `TypeError` `not_object`.
pub(crate) fn read_js<T: DeserializeOwned>(
    value: &JsValue,
    what: &str,
    not_object: &str,
    naming: &Naming,
) -> Result<Option<T>> {
    match json_from_js(value, what)? {
        Value::Null => Ok(None),
        json @ Value::Object(_) => read(&json, naming).map(Some),
        _ => Err(Error::type_error(not_object)),
    }
}

/// Fails a field's `Deserialize` with `error`, its own text and kind (a field type that parses
/// its value itself, such as an algorithm's name, reports through this).
pub(crate) fn fail<E: de::Error>(error: Error) -> E {
    CARRIED.with(|carried| *carried.borrow_mut() = Some(error));
    E::custom("(a distopt error)")
}

thread_local! {
    /// The error [`fail`] handed to serde, until [`Failure`] takes it back.
    static CARRIED: RefCell<Option<Error>> = const { RefCell::new(None) };
}

/// What reading failed with.
#[derive(Debug)]
enum Failure {
    Error(Error),
    /// A required key was left out (named by [`Naming::missing`]).
    Missing(&'static str),
    /// serde's own message (a number too large for its field), named by its key on the way out.
    Serde(String),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Error(error) => error.fmt(f),
            Failure::Missing(key) => write!(f, "missing '{key}'"),
            Failure::Serde(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for Failure {}

impl Failure {
    /// The failure of the value at `key`: serde's own message named by the key (a
    /// `ValueError` for a value of the right kind out of its field's range, such as a count
    /// too large for `usize`; else a `TypeError`).
    fn at(self, key: &str, naming: &Naming) -> Failure {
        match self {
            Failure::Serde(message) => {
                let text = format!("{}: {message}", (naming.key)(key));
                Failure::Error(if message.starts_with("invalid value") {
                    Error::value(text)
                } else {
                    Error::type_error(text)
                })
            }
            other => other,
        }
    }
}

impl de::Error for Failure {
    fn custom<T: fmt::Display>(message: T) -> Self {
        match CARRIED.with(|carried| carried.borrow_mut().take()) {
            Some(error) => Failure::Error(error),
            None => Failure::Serde(message.to_string()),
        }
    }

    fn missing_field(field: &'static str) -> Self {
        Failure::Missing(field)
    }
}

/// One value of the object, and where it sits.
struct Reader<'a> {
    value: &'a Value,
    /// Its key (`None` at the top).
    key: Option<&'a str>,
    /// The name of the object a nested object found here is (for unknown-key messages).
    object: &'a str,
    naming: &'a Naming,
}

impl<'a> Reader<'a> {
    /// `{key} must be {what}, got {value}` as a `TypeError`.
    fn wrong(&self, what: &str) -> Failure {
        Failure::Error(Error::type_error(format!(
            "{} must be {what}, got {}",
            (self.naming.key)(self.key.unwrap_or(self.naming.name)),
            self.value
        )))
    }

    /// The object a struct with `fields` reads, every key checked before any value is read.
    /// (Not generic: one copy serves every struct.)
    fn object_of(&self, fields: &[&str]) -> Result<&'a Map<String, Value>, Failure> {
        let Value::Object(map) = self.value else {
            return Err(self.wrong("an object"));
        };
        match map.keys().find(|k| !fields.contains(&k.as_str())) {
            Some(key) => Err(Failure::Error(Error::type_error((self.naming.unknown)(
                self.object,
                key,
                fields,
            )))),
            None => Ok(map),
        }
    }
}

impl<'de> de::Deserializer<'de> for Reader<'de> {
    type Error = Failure;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Failure> {
        // A field type that reads the value as it is (`Value::deserialize`), borrowed.
        self.value
            .deserialize_any(visitor)
            .map_err(<Failure as de::Error>::custom)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Failure> {
        match self.value {
            Value::Bool(b) => visitor.visit_bool(*b),
            _ => Err(self.wrong("a boolean")),
        }
    }

    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Failure> {
        let text = || {
            format!(
                "{} must be a non-negative integer, got {}",
                (self.naming.key)(self.key.unwrap_or_default()),
                self.value
            )
        };
        match (self.value.as_u64(), self.value.as_f64()) {
            (Some(n), _) => visitor.visit_u64(n),
            // JS's -0 (a float pattern matches it too).
            (None, Some(0.0)) => visitor.visit_u64(0),
            (None, Some(x)) if x < 0.0 && x.fract() == 0.0 => {
                Err(Failure::Error(Error::value(text())))
            }
            _ => Err(Failure::Error(Error::type_error(text()))),
        }
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Failure> {
        // A NaN or an infinity is `"nan"`, `"inf"` or `"-inf"` in the JSON form.
        let non_finite = matches!(self.value, Value::String(_))
            .then(|| number_from_json(self.value, &String::new).ok())
            .flatten();
        match self.value.as_f64().or(non_finite) {
            Some(x) => visitor.visit_f64(x),
            None => Err(self.wrong("a number")),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Failure> {
        match self.value {
            Value::String(s) => visitor.visit_str(s),
            _ => Err(self.wrong("a string")),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Failure> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Failure> {
        match self.value {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Failure> {
        let map = self.object_of(fields)?;
        visitor.visit_map(Entries {
            entries: map.iter(),
            value: None,
            naming: self.naming,
        })
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Failure> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i64 i128 u8 u16 u32 u128 f32 char bytes byte_buf unit unit_struct
        newtype_struct seq tuple tuple_struct map enum identifier
    }
}

/// The entries of an object, for a struct's visitor.
struct Entries<'a> {
    entries: serde_json::map::Iter<'a>,
    value: Option<(&'a str, &'a Value)>,
    naming: &'a Naming,
}

impl<'de> de::MapAccess<'de> for Entries<'de> {
    type Error = Failure;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Failure> {
        let Some((key, value)) = self.entries.next() else {
            return Ok(None);
        };
        self.value = Some((key, value));
        seed.deserialize(key.as_str().into_deserializer()).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Failure> {
        let (key, value) = self
            .value
            .take()
            .ok_or_else(|| Failure::Error(Error::runtime("internal: a value without its key")))?;
        seed.deserialize(Reader {
            value,
            key: Some(key),
            object: key,
            naming: self.naming,
        })
        .map_err(|failure| failure.at(key, self.naming))
    }
}

/// The messages of an options object of class `object`: `options.enable must be a boolean, got
/// 1` (keys named by `key`), `unknown Join option 'x': expected enable, … or …`.
pub(crate) fn options_naming(object: &'static str, key: fn(&str) -> String) -> Naming {
    Naming {
        name: object,
        key,
        unknown: |object, key, known| {
            let (last, rest) = known.split_last().unwrap_or((&"", &[]));
            let expected = if rest.is_empty() {
                last.to_string()
            } else {
                format!("{} or {last}", rest.join(", "))
            };
            format!("unknown {object} option '{key}': expected {expected}")
        },
        missing: |key| format!("the option '{key}' is required"),
    }
}
