//! Provides the two halves of reading and writing an adjacently tagged value
//! (`#[serde(tag = "...", content = "...")]`) whose tag is stored beside its content rather
//! than with it: [`ContentOf`] writes only the content, straight into the caller's serializer,
//! and [`TaggedContent`] reads a value from a tag already known and its content's deserializer.
//!
//! The event codec reads and writes an event's `data` this way. Going through a
//! `serde_json::Value` (the tagged object, then its content taken out, or put in) cost more than
//! the rest of a sled append, and most of a cold resume: every field became a map entry,
//! allocated, hashed and then copied again.

use std::fmt::Display;
use std::marker::PhantomData;

use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, Visitor};
use serde::ser::{self, Impossible, Serialize, SerializeStruct, Serializer};
use serde::{Deserialize, Deserializer};

/// Serializes as the content of the adjacently tagged `T` whose content field is named
/// `content`: the field's value, or `null` for a variant without one. Anything else `T` might
/// serialize as is an error.
pub(super) struct ContentOf<'a, T> {
    pub(super) value: &'a T,
    pub(super) content: &'static str,
}

impl<T: Serialize> Serialize for ContentOf<'_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(ContentOnly {
            inner: serializer,
            content: self.content,
        })
    }
}

/// Accepts the struct an adjacently tagged variant serializes as, and nothing else.
struct ContentOnly<S> {
    inner: S,
    content: &'static str,
}

/// Forwards the content field to the inner serializer and drops the tag.
struct ContentField<S: Serializer> {
    inner: Option<S>,
    content: &'static str,
    written: Option<S::Ok>,
}

fn not_adjacently_tagged<E: ser::Error>(found: impl Display) -> E {
    E::custom(format_args!(
        "expected an adjacently tagged value, found {found}"
    ))
}

/// The scalar `serialize_*` methods, each refused.
macro_rules! refuse {
    ($($method:ident($ty:ty)),* $(,)?) => {
        $(fn $method(self, _: $ty) -> Result<S::Ok, S::Error> {
            Err(not_adjacently_tagged(stringify!($ty)))
        })*
    };
}

impl<S: Serializer> Serializer for ContentOnly<S> {
    type Ok = S::Ok;
    type Error = S::Error;
    type SerializeSeq = Impossible<S::Ok, S::Error>;
    type SerializeTuple = Impossible<S::Ok, S::Error>;
    type SerializeTupleStruct = Impossible<S::Ok, S::Error>;
    type SerializeTupleVariant = Impossible<S::Ok, S::Error>;
    type SerializeMap = Impossible<S::Ok, S::Error>;
    type SerializeStruct = ContentField<S>;
    type SerializeStructVariant = Impossible<S::Ok, S::Error>;

    refuse!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_f32(f32),
        serialize_f64(f64),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
        serialize_unit_struct(&'static str),
    );

    fn serialize_none(self) -> Result<S::Ok, S::Error> {
        Err(not_adjacently_tagged("none"))
    }

    fn serialize_some<T: ?Sized + Serialize>(self, _: &T) -> Result<S::Ok, S::Error> {
        Err(not_adjacently_tagged("some"))
    }

    fn serialize_unit(self) -> Result<S::Ok, S::Error> {
        Err(not_adjacently_tagged("unit"))
    }

    fn serialize_unit_variant(
        self,
        name: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<S::Ok, S::Error> {
        Err(not_adjacently_tagged(format_args!("{name}::{variant}")))
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        name: &'static str,
        _: &T,
    ) -> Result<S::Ok, S::Error> {
        Err(not_adjacently_tagged(name))
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        name: &'static str,
        _: u32,
        variant: &'static str,
        _: &T,
    ) -> Result<S::Ok, S::Error> {
        Err(not_adjacently_tagged(format_args!("{name}::{variant}")))
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, S::Error> {
        Err(not_adjacently_tagged("a sequence"))
    }

    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, S::Error> {
        Err(not_adjacently_tagged("a tuple"))
    }

    fn serialize_tuple_struct(
        self,
        name: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, S::Error> {
        Err(not_adjacently_tagged(name))
    }

    fn serialize_tuple_variant(
        self,
        name: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, S::Error> {
        Err(not_adjacently_tagged(format_args!("{name}::{variant}")))
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, S::Error> {
        Err(not_adjacently_tagged("a map"))
    }

    fn serialize_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStruct, S::Error> {
        Ok(ContentField {
            inner: Some(self.inner),
            content: self.content,
            written: None,
        })
    }

    fn serialize_struct_variant(
        self,
        name: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, S::Error> {
        Err(not_adjacently_tagged(format_args!("{name}::{variant}")))
    }
}

impl<S: Serializer> SerializeStruct for ContentField<S> {
    type Ok = S::Ok;
    type Error = S::Error;

    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), S::Error> {
        if key == self.content {
            let inner = self
                .inner
                .take()
                .ok_or_else(|| not_adjacently_tagged("two content fields"))?;
            self.written = Some(value.serialize(inner)?);
        }
        Ok(())
    }

    fn end(self) -> Result<S::Ok, S::Error> {
        match (self.written, self.inner) {
            (Some(written), _) => Ok(written),
            // A variant without content (a unit variant).
            (None, Some(inner)) => inner.serialize_unit(),
            (None, None) => Err(not_adjacently_tagged("a content field that wrote nothing")),
        }
    }
}

/// Reads the adjacently tagged `T` from its tag, known already, and its content's
/// deserializer: as if from `{ "<tag_field>": tag, "<content>": ... }`, tag first.
pub(super) struct TaggedContent<'a, T> {
    tag_field: &'static str,
    tag: &'a str,
    content: &'static str,
    value: PhantomData<fn() -> T>,
}

impl<'a, T> TaggedContent<'a, T> {
    /// Reads `T` with tag field `tag_field` holding `tag`, and content field `content`.
    pub(super) fn new(tag_field: &'static str, tag: &'a str, content: &'static str) -> Self {
        Self {
            tag_field,
            tag,
            content,
            value: PhantomData,
        }
    }
}

impl<'de, T: Deserialize<'de>> DeserializeSeed<'de> for TaggedContent<'_, T> {
    type Value = T;

    fn deserialize<D: Deserializer<'de>>(self, content: D) -> Result<T, D::Error> {
        T::deserialize(TaggedMap {
            tag_field: self.tag_field,
            tag: self.tag,
            content_field: self.content,
            content: Some(content),
            entries_read: 0,
        })
    }
}

/// A two-entry map, tag then content, with the content read from the wrapped deserializer.
struct TaggedMap<'a, D> {
    tag_field: &'static str,
    tag: &'a str,
    content_field: &'static str,
    content: Option<D>,
    entries_read: u8,
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for TaggedMap<'_, D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        visitor.visit_map(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

impl<'de, D: Deserializer<'de>> MapAccess<'de> for TaggedMap<'_, D> {
    type Error = D::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, D::Error> {
        let key = match self.entries_read {
            0 => self.tag_field,
            1 => self.content_field,
            _ => return Ok(None),
        };
        seed.deserialize(key.into_deserializer()).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, D::Error> {
        self.entries_read += 1;
        match self.entries_read {
            1 => seed.deserialize(self.tag.into_deserializer()),
            _ => match self.content.take() {
                Some(content) => seed.deserialize(content),
                None => Err(de::Error::custom("the content was read twice")),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use serde::de::DeserializeSeed;
    use serde::{Deserialize, Serialize};
    use serde_json::json;

    use super::{ContentOf, TaggedContent};

    #[derive(Serialize)]
    #[serde(tag = "type", content = "data")]
    enum Tagged {
        Unit,
        Newtype(u32),
        Tuple(u32, &'static str),
        Struct { a: u32, b: Option<u32> },
        Empty {},
    }

    fn content(value: &Tagged) -> serde_json::Value {
        let bytes = serde_json::to_vec(&ContentOf {
            value,
            content: "data",
        })
        .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn each_variant_shape_writes_what_the_tagged_object_holds_under_its_content_field() {
        for value in [
            Tagged::Unit,
            Tagged::Newtype(7),
            Tagged::Tuple(1, "x"),
            Tagged::Struct { a: 1, b: None },
            Tagged::Empty {},
        ] {
            let tagged = serde_json::to_value(&value).unwrap();
            let expected = tagged.get("data").cloned().unwrap_or(json!(null));
            assert_eq!(content(&value), expected);
        }
    }

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(tag = "type", content = "data")]
    enum Read {
        Unit,
        Newtype(u32),
        Struct { a: u32 },
    }

    fn read(tag: &str, content: &str) -> Result<Read, serde_json::Error> {
        let mut deserializer = serde_json::Deserializer::from_str(content);
        TaggedContent::new("type", tag, "data").deserialize(&mut deserializer)
    }

    #[test]
    fn a_value_reads_from_its_known_tag_and_its_content_alone() {
        assert_eq!(read("Newtype", "7").unwrap(), Read::Newtype(7));
        assert_eq!(read("Struct", r#"{"a":1}"#).unwrap(), Read::Struct { a: 1 });
        assert_eq!(read("Unit", "null").unwrap(), Read::Unit);
        let unknown = read("Missing", "1").unwrap_err().to_string();
        assert!(unknown.contains("unknown variant"), "{unknown}");
        let mistyped = read("Struct", "3").unwrap_err().to_string();
        assert!(mistyped.contains("invalid type"), "{mistyped}");
    }

    #[test]
    fn a_value_that_is_not_adjacently_tagged_is_an_error() {
        let error = serde_json::to_vec(&ContentOf {
            value: &5_u32,
            content: "data",
        })
        .unwrap_err();
        assert!(error.to_string().contains("adjacently tagged"), "{error}");
    }
}
