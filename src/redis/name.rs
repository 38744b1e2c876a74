//! How Redis names a client's states: one function for both modes, exact and synced.

/// The Redis key of one of `client`'s states: `prefix{tag}:state`, the tag being `client`
/// escaped by [`hash_tag`]. Every name of a client is built here, in both modes, so that:
///
/// - distinct clients never share a name: the prefix has no brace (checked when a limiter is
///   built) and the tag none either, so the name's first `}` ends the tag, the tag gives back
///   the client, and whatever follows it (`state`, which may hold `:`) cannot be mistaken for
///   part of another client's tag;
/// - all of a client's names hash to one Cluster slot: Cluster hashes the text between the
///   first `{` and the first `}` after it, which is exactly the tag, never empty.
pub(crate) fn state_key(prefix: &str, client: &str, state: impl std::fmt::Display) -> String {
    format!("{prefix}{{{}}}:{state}", hash_tag(client))
}

/// The empty client's tag: a `%` that escapes nothing, which no other client's tag is (in
/// every other tag, a `%` starts one of the three escapes).
const EMPTY_TAG: &str = "%";

/// `client` as its names' hash tag: `%`, `{` and `}` written as `%25`, `%7B` and `%7D` (so
/// the tag holds no brace, and two clients never share one), the rest as it is; the empty
/// client, whose tag would be empty (Cluster would hash each name whole, to different slots),
/// as [`EMPTY_TAG`].
fn hash_tag(client: &str) -> std::borrow::Cow<'_, str> {
    if client.is_empty() {
        return EMPTY_TAG.into();
    }
    if !client.contains(['%', '{', '}']) {
        return client.into();
    }
    let mut tag = String::with_capacity(client.len() + 8);
    for c in client.chars() {
        match c {
            '%' => tag.push_str("%25"),
            '{' => tag.push_str("%7B"),
            '}' => tag.push_str("%7D"),
            c => tag.push(c),
        }
    }
    tag.into()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{hash_tag, state_key};

    /// The hash tag Redis Cluster hashes a key by: the text between the first `{` and the first
    /// `}` after it, if that is not empty (else the key is hashed whole: `None`).
    fn cluster_tag(key: &str) -> Option<&str> {
        let open = key.find('{')?;
        let len = key[open + 1..].find('}')?;
        (len > 0).then(|| &key[open + 1..open + 1 + len])
    }

    /// The client a tag was made from; `None` for text no client's tag is.
    fn decode(tag: &str) -> Option<String> {
        if tag == "%" {
            return Some(String::new());
        }
        let mut out = String::new();
        let mut rest = tag;
        while let Some(at) = rest.find('%') {
            out.push_str(&rest[..at]);
            let c = match rest.get(at..at + 3)? {
                "%25" => '%',
                "%7B" => '{',
                "%7D" => '}',
                _ => return None,
            };
            out.push(c);
            rest = &rest[at + 3..];
        }
        out.push_str(rest);
        (!out.is_empty()).then_some(out)
    }

    /// Clients drawn from the characters the escaping is about, so that near misses (`{` and
    /// `%7B`, `}` and `_`, `""` and `%`) come up often; and any text at all.
    fn client() -> impl Strategy<Value = String> {
        prop_oneof!["[{}%_7BD25a:]{0,8}", any::<String>(),]
    }

    /// The pairs issue 36 found merged when braces were replaced by `_`, and the escapes' own
    /// near misses.
    #[test]
    fn lookalike_clients_get_their_own_names() {
        let pairs = [
            ("{alice}", "_alice_"),
            ("a{b", "a_b"),
            ("}", "_"),
            ("", "%"),
            ("{", "%7B"),
            ("%7B", "%257B"),
            ("", "\u{1}"),
        ];
        for (a, b) in pairs {
            let (na, nb) = (state_key("p:", a, "s"), state_key("p:", b, "s"));
            assert_ne!(na, nb, "{a:?} and {b:?}");
            assert_eq!(cluster_tag(&na), Some(&*hash_tag(a)), "{na:?}");
            assert_eq!(cluster_tag(&nb), Some(&*hash_tag(b)), "{nb:?}");
        }
        assert_eq!(state_key("p:", "{alice}", "s"), "p:{%7Balice%7D}:s");
        assert_eq!(state_key("p:", "", "s"), "p:{%}:s");
        assert_eq!(state_key("p:", "u1", "s"), "p:{u1}:s");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// Whatever the prefix (braces are refused there), client and state: Cluster takes the
        /// escaped client as the tag, never empty and holding no brace, and the tag gives the
        /// client back, so two clients never share a name whatever states follow.
        #[test]
        fn names_are_injective_with_the_client_as_tag(
            prefix in "[^{}]{0,6}",
            a in client(),
            b in client(),
            sa in any::<String>(),
            sb in any::<String>(),
        ) {
            let name = state_key(&prefix, &a, &sa);
            let tag = cluster_tag(&name);
            prop_assert_eq!(tag, Some(&*hash_tag(&a)));
            let tag = tag.unwrap();
            prop_assert!(!tag.is_empty() && !tag.contains(['{', '}']), "tag {:?}", tag);
            prop_assert_eq!(decode(tag), Some(a.clone()));
            if a != b {
                prop_assert_ne!(&name, &state_key(&prefix, &b, &sb));
                prop_assert_ne!(hash_tag(&a), hash_tag(&b));
            }
        }
    }
}
