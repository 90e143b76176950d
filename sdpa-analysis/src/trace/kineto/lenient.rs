//! Tolerant little deserializers for trace fields. Profilers and tools disagree on types (ids as numbers or
//! strings, `ts` as integer or float, `args` missing or null): each reader here takes what it understands
//! and skips the rest without failing the file. Only malformed JSON is an error.

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// A number from a JSON number, a numeric string, or a bool; `None` for anything else.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Num(pub Option<f64>);

impl<'de> de::Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NumVisitor)
    }
}

struct NumVisitor;

impl<'de> Visitor<'de> for NumVisitor {
    type Value = Num;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a number")
    }
    fn visit_i64<E>(self, v: i64) -> Result<Num, E> {
        Ok(Num(Some(v as f64)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Num, E> {
        Ok(Num(Some(v as f64)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Num, E> {
        Ok(Num(Some(v)))
    }
    fn visit_bool<E>(self, v: bool) -> Result<Num, E> {
        Ok(Num(Some(if v { 1.0 } else { 0.0 })))
    }
    fn visit_str<E>(self, v: &str) -> Result<Num, E> {
        Ok(Num(v.trim().parse::<f64>().ok()))
    }
    fn visit_unit<E>(self) -> Result<Num, E> {
        Ok(Num(None))
    }
    fn visit_none<E>(self) -> Result<Num, E> {
        Ok(Num(None))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Num, A::Error> {
        while s.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Num(None))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Num, A::Error> {
        while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Num(None))
    }
}

/// An integer id: integral numbers and numeric strings as themselves, other strings hashed into a
/// negative number (so `"Spans"` rows stay distinct), anything else `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Id(pub Option<i64>);

impl<'de> de::Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(IdVisitor)
    }
}

struct IdVisitor;

impl<'de> Visitor<'de> for IdVisitor {
    type Value = Id;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an id")
    }
    fn visit_i64<E>(self, v: i64) -> Result<Id, E> {
        Ok(Id(Some(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Id, E> {
        Ok(Id(Some(v as i64)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Id, E> {
        Ok(Id(if v.is_finite() { Some(v as i64) } else { None }))
    }
    fn visit_bool<E>(self, v: bool) -> Result<Id, E> {
        Ok(Id(Some(v as i64)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Id, E> {
        if let Ok(n) = v.trim().parse::<i64>() {
            return Ok(Id(Some(n)));
        }
        // FNV-1a, folded into the negative range so it never collides with a real pid/tid.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in v.bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        Ok(Id(Some(-((h >> 2) as i64) - 1)))
    }
    fn visit_unit<E>(self) -> Result<Id, E> {
        Ok(Id(None))
    }
    fn visit_none<E>(self) -> Result<Id, E> {
        Ok(Id(None))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Id, A::Error> {
        while s.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Id(None))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Id, A::Error> {
        while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Id(None))
    }
}

/// A string; numbers and bools become their text, anything else `""`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Str(pub String);

impl<'de> de::Deserialize<'de> for Str {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrVisitor)
    }
}

struct StrVisitor;

impl<'de> Visitor<'de> for StrVisitor {
    type Value = Str;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E>(self, v: &str) -> Result<Str, E> {
        Ok(Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Str, E> {
        Ok(Str(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Str, E> {
        Ok(Str(v.to_string()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Str, E> {
        Ok(Str(v.to_string()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Str, E> {
        Ok(Str(v.to_string()))
    }
    fn visit_bool<E>(self, v: bool) -> Result<Str, E> {
        Ok(Str(if v { "True".into() } else { "False".into() }))
    }
    fn visit_unit<E>(self) -> Result<Str, E> {
        Ok(Str::default())
    }
    fn visit_none<E>(self) -> Result<Str, E> {
        Ok(Str::default())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Str, A::Error> {
        while s.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Str::default())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Str, A::Error> {
        while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Str::default())
    }
}

/// A list of strings (`Input type`, `Concrete Inputs`); a non-list gives an empty list.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StrList(pub Vec<String>);

impl<'de> de::Deserialize<'de> for StrList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrListVisitor)
    }
}

struct StrListVisitor;

impl<'de> Visitor<'de> for StrListVisitor {
    type Value = StrList;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of strings")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<StrList, A::Error> {
        let mut v = Vec::new();
        while let Some(Str(x)) = s.next_element::<Str>()? {
            v.push(x);
        }
        Ok(StrList(v))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<StrList, A::Error> {
        while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(StrList::default())
    }
    fn visit_str<E>(self, _: &str) -> Result<StrList, E> {
        Ok(StrList::default())
    }
    fn visit_i64<E>(self, _: i64) -> Result<StrList, E> {
        Ok(StrList::default())
    }
    fn visit_u64<E>(self, _: u64) -> Result<StrList, E> {
        Ok(StrList::default())
    }
    fn visit_f64<E>(self, _: f64) -> Result<StrList, E> {
        Ok(StrList::default())
    }
    fn visit_bool<E>(self, _: bool) -> Result<StrList, E> {
        Ok(StrList::default())
    }
    fn visit_unit<E>(self) -> Result<StrList, E> {
        Ok(StrList::default())
    }
}

/// A list of integer lists (`Input Dims`, `Input Strides`); an entry that is not a flat list of integers
/// (a scalar, a tensor list) is `None`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DimsList(pub Vec<Option<Vec<i64>>>);

impl<'de> de::Deserialize<'de> for DimsList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DimsListVisitor)
    }
}

struct DimsListVisitor;

impl<'de> Visitor<'de> for DimsListVisitor {
    type Value = DimsList;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of dims")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<DimsList, A::Error> {
        let mut v = Vec::new();
        while let Some(Dims(x)) = s.next_element::<Dims>()? {
            v.push(x);
        }
        Ok(DimsList(v))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<DimsList, A::Error> {
        while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(DimsList::default())
    }
    fn visit_str<E>(self, _: &str) -> Result<DimsList, E> {
        Ok(DimsList::default())
    }
    fn visit_i64<E>(self, _: i64) -> Result<DimsList, E> {
        Ok(DimsList::default())
    }
    fn visit_u64<E>(self, _: u64) -> Result<DimsList, E> {
        Ok(DimsList::default())
    }
    fn visit_f64<E>(self, _: f64) -> Result<DimsList, E> {
        Ok(DimsList::default())
    }
    fn visit_bool<E>(self, _: bool) -> Result<DimsList, E> {
        Ok(DimsList::default())
    }
    fn visit_unit<E>(self) -> Result<DimsList, E> {
        Ok(DimsList::default())
    }
}

/// One flat integer list, or `None`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Dims(pub Option<Vec<i64>>);

impl<'de> de::Deserialize<'de> for Dims {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DimsVisitor)
    }
}

struct DimsVisitor;

impl<'de> Visitor<'de> for DimsVisitor {
    type Value = Dims;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of integers")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Dims, A::Error> {
        let mut v = Vec::new();
        let mut ok = true;
        while let Some(Num(x)) = s.next_element::<Num>()? {
            match x {
                Some(n) if ok && n.is_finite() && n.fract() == 0.0 => v.push(n as i64),
                _ => ok = false,
            }
        }
        Ok(Dims(if ok { Some(v) } else { None }))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Dims, A::Error> {
        while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Dims(None))
    }
    fn visit_str<E>(self, _: &str) -> Result<Dims, E> {
        Ok(Dims(None))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Dims, E> {
        Ok(Dims(None))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Dims, E> {
        Ok(Dims(None))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Dims, E> {
        Ok(Dims(None))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Dims, E> {
        Ok(Dims(None))
    }
    fn visit_unit<E>(self) -> Result<Dims, E> {
        Ok(Dims(None))
    }
}
