//! `docs/config.md` against the parsers: every key the parsers accept is in the page, under
//! its table, and nothing else is; every example block in the page parses. The keys are read
//! from the parsers' own serde types by walking them (a deserializer that answers every field
//! they ask for), so a key added to a parser fails here until the page has it.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::de::value::{BorrowedStrDeserializer, Error as WalkError};
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

/// Table heading (`[http]`, `[[http.routes]]`, `[plans.<name>]`) to the keys it accepts.
type Keys = BTreeMap<String, BTreeSet<String>>;

struct Walk<'a> {
    /// The dotted path of the value being read (empty at the top).
    path: String,
    /// Reached as an item of a list (a heading `[[path]]`).
    item: bool,
    keys: &'a RefCell<Keys>,
    /// A value asked for as "anything" is text (`key = "ip"`), or an integer at these paths
    /// (`limit`): a walk that fails adds the path last asked and runs again.
    integers: &'a RefCell<HashSet<String>>,
    last_any: &'a RefCell<Option<String>>,
}

impl<'a> Walk<'a> {
    fn at(&self, path: String, item: bool) -> Walk<'a> {
        Walk {
            path,
            item,
            keys: self.keys,
            integers: self.integers,
            last_any: self.last_any,
        }
    }
    fn child(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }
}

/// A map that yields each of `entries` once, each value read by its own walk.
struct Entries<'a> {
    entries: std::vec::IntoIter<(&'static str, Walk<'a>)>,
    value: Option<Walk<'a>>,
}

impl<'de> MapAccess<'de> for Entries<'_> {
    type Error = WalkError;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, WalkError> {
        let Some((key, walk)) = self.entries.next() else {
            return Ok(None);
        };
        self.value = Some(walk);
        seed.deserialize(BorrowedStrDeserializer::<WalkError>::new(key))
            .map(Some)
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, WalkError> {
        seed.deserialize(self.value.take().expect("a key first"))
    }
}

/// A list of one item.
struct One<'a>(Option<Walk<'a>>);

impl<'de> SeqAccess<'de> for One<'_> {
    type Error = WalkError;
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, WalkError> {
        self.0.take().map(|walk| seed.deserialize(walk)).transpose()
    }
}

impl<'de> de::Deserializer<'de> for Walk<'_> {
    type Error = WalkError;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, WalkError> {
        *self.last_any.borrow_mut() = Some(self.path.clone());
        if self.integers.borrow().contains(&self.path) {
            v.visit_i64(1)
        } else {
            v.visit_str("1s")
        }
    }
    fn deserialize_bool<V: Visitor<'de>>(self, v: V) -> Result<V::Value, WalkError> {
        v.visit_bool(false)
    }
    fn deserialize_i64<V: Visitor<'de>>(self, v: V) -> Result<V::Value, WalkError> {
        v.visit_i64(1)
    }
    fn deserialize_u64<V: Visitor<'de>>(self, v: V) -> Result<V::Value, WalkError> {
        v.visit_u64(0)
    }
    fn deserialize_str<V: Visitor<'de>>(self, v: V) -> Result<V::Value, WalkError> {
        v.visit_str("x")
    }
    fn deserialize_string<V: Visitor<'de>>(self, v: V) -> Result<V::Value, WalkError> {
        v.visit_str("x")
    }
    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, WalkError> {
        v.visit_some(self)
    }
    fn deserialize_ignored_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, WalkError> {
        v.visit_unit()
    }
    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, WalkError> {
        let item = self.at(self.path.clone(), true);
        v.visit_seq(One(Some(item)))
    }
    /// A table of names the user chooses (`[plans.<name>]`, `api_keys`): one entry.
    fn deserialize_map<V: Visitor<'de>>(self, v: V) -> Result<V::Value, WalkError> {
        let value = self.at(self.child("<name>"), false);
        v.visit_map(Entries {
            entries: vec![("<name>", value)].into_iter(),
            value: None,
        })
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, WalkError> {
        // toml's `Spanned` asks for a struct of a start, an end and the value itself.
        if name.starts_with("$__serde_spanned") {
            let entries = fields.iter().map(|f| {
                let walk = self.at(self.path.clone(), self.item);
                (*f, walk)
            });
            return v.visit_map(Entries {
                entries: entries.collect::<Vec<_>>().into_iter(),
                value: None,
            });
        }
        if !self.path.is_empty() {
            let heading = if self.item {
                format!("[[{}]]", self.path)
            } else {
                format!("[{}]", self.path)
            };
            let mut keys = self.keys.borrow_mut();
            keys.entry(heading)
                .or_default()
                .extend(fields.iter().map(|f| f.to_string()));
        }
        let entries = fields.iter().map(|f| (*f, self.at(self.child(f), false)));
        v.visit_map(Entries {
            entries: entries.collect::<Vec<_>>().into_iter(),
            value: None,
        })
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i128 u8 u16 u32 u128 f32 f64 char bytes byte_buf unit unit_struct
        newtype_struct tuple tuple_struct enum identifier
    }
}

/// Every table and key a parser's type `T` accepts.
fn keys_of<T: for<'de> serde::Deserialize<'de>>(keys: &RefCell<Keys>) {
    let integers = RefCell::new(HashSet::new());
    let last_any = RefCell::new(None);
    for _ in 0..64 {
        let walk = Walk {
            path: String::new(),
            item: false,
            keys,
            integers: &integers,
            last_any: &last_any,
        };
        match T::deserialize(walk) {
            Ok(_) => return,
            Err(e) => {
                let path = last_any.borrow_mut().take();
                let Some(path) = path else {
                    panic!("the walk failed before any value asked for anything: {e}")
                };
                assert!(
                    integers.borrow_mut().insert(path.clone()),
                    "{path}: neither text nor an integer: {e}"
                );
            }
        }
    }
    panic!("the walk did not finish");
}

/// The tables and keys `docs/config.md` lists: under a heading that names a table in
/// backticks (`` ## `[http]` ``), the first cell of each row of its key table (`` | `key` | ``).
fn keys_in_page(page: &str) -> Keys {
    let mut keys = Keys::new();
    let mut table: Option<String> = None;
    for line in page.lines() {
        if line.starts_with('#') {
            table = line
                .split('`')
                .nth(1)
                .filter(|t| t.starts_with('['))
                .map(str::to_string);
        } else if let (Some(t), Some(row)) = (&table, line.strip_prefix("| `")) {
            let key = row.split('`').next().expect("a key in backticks");
            keys.entry(t.clone()).or_default().insert(key.to_string());
        }
    }
    keys
}

/// The TOML example blocks of a page.
fn toml_blocks(page: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in page.lines() {
        match &mut current {
            None if line.trim_start() == "```toml" => current = Some(String::new()),
            Some(block) if line.trim_start() == "```" => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    assert!(current.is_none(), "an example block is not closed");
    blocks
}

const PAGE: &str = include_str!("../../docs/config.md");

#[test]
fn docs_config_lists_every_key_the_parsers_accept() {
    let accepted = RefCell::new(Keys::new());
    keys_of::<crate::plan::config::File>(&accepted);
    keys_of::<crate::http::RawFile>(&accepted);
    let accepted = accepted.into_inner();
    // The walk itself reaches every table (a walk that stopped early would pass anything).
    assert_eq!(
        accepted.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "[[http.routes]]",
            "[[plans.<name>.limits]]",
            "[http.global]",
            "[http]",
            "[plans.<name>]",
            "[redis]"
        ]
    );
    assert!(accepted["[plans.<name>]"].contains("limit"));
    assert!(accepted["[http]"].contains("max_keys"));
    let documented = keys_in_page(PAGE);
    for (table, keys) in &accepted {
        let listed = documented.get(table).cloned().unwrap_or_default();
        let missing: Vec<_> = keys.difference(&listed).collect();
        assert!(
            missing.is_empty(),
            "docs/config.md: {table} lacks {missing:?}"
        );
    }
    for (table, keys) in &documented {
        let known = accepted.get(table).cloned().unwrap_or_default();
        let extra: Vec<_> = keys.difference(&known).collect();
        assert!(
            extra.is_empty(),
            "docs/config.md: {table} lists {extra:?}, which no parser accepts"
        );
    }
}

#[test]
fn docs_config_examples_parse() {
    let blocks = toml_blocks(PAGE);
    assert!(blocks.len() >= 5, "{} example blocks", blocks.len());
    for block in blocks {
        if let Err(e) = crate::http::HttpConfig::parse(&block) {
            panic!("docs/config.md: an example does not parse: {e}\n{block}");
        }
    }
}
