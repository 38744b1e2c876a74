//! Route paths as rules and exemptions name them: exact (`/login`), a prefix (`/api/*`), or
//! axum-style segments with parameters (`/users/{id}/export`, a trailing `{*rest}`), checked
//! once when the layer is built so that a path no request can have is an error, not a rule
//! that silently never applies.

/// A compiled path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PathPattern {
    /// This path only.
    Exact(String),
    /// Every path that starts with this (written with a trailing `*`).
    Prefix(String),
    /// Segment by segment; `rest`: a trailing `{*rest}` takes one or more characters more.
    Segments { segments: Vec<Segment>, rest: bool },
}

/// One segment of a [`PathPattern::Segments`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    /// This text.
    Literal(String),
    /// `{name}`: any non-empty segment.
    Param,
}

impl PathPattern {
    /// Parses a path as written in a rule; the error says why no request path could match it.
    pub(crate) fn parse(text: &str) -> Result<PathPattern, String> {
        if !text.starts_with('/') {
            return Err(format!("'{text}' must start with '/'"));
        }
        if let Some(c) = text
            .chars()
            .find(|&c| !c.is_ascii_graphic() || c == '?' || c == '#')
        {
            return Err(format!(
                "'{text}' holds {c:?}, which no request path has (a path is visible ASCII \
                 without '?' or '#'; percent-encode anything else as clients send it)"
            ));
        }
        if !text.contains(['{', '}']) {
            return Ok(match text.strip_suffix('*') {
                Some(prefix) => PathPattern::Prefix(prefix.to_string()),
                None => PathPattern::Exact(text.to_string()),
            });
        }
        let all: Vec<&str> = text[1..].split('/').collect();
        let mut segments = Vec::with_capacity(all.len());
        let mut rest = false;
        for (i, seg) in all.iter().enumerate() {
            let param = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}'));
            match param {
                Some(name) if name.contains(['{', '}']) || name.is_empty() || name == "*" => {
                    return Err(format!("'{text}': '{seg}' is not a parameter (`{{id}}`)"));
                }
                Some(name) if name.starts_with('*') => {
                    if i + 1 != all.len() {
                        return Err(format!(
                            "'{text}': the catch-all '{seg}' must be the last segment"
                        ));
                    }
                    rest = true;
                }
                Some(_) => segments.push(Segment::Param),
                None if seg.contains(['{', '}']) => {
                    return Err(format!(
                        "'{text}': a parameter is a whole segment ('/{{id}}/'), not '{seg}'"
                    ));
                }
                None if i + 1 == all.len() && seg.ends_with('*') => {
                    return Err(format!(
                        "'{text}': with parameters, end the path with `{{*rest}}`, not '*'"
                    ));
                }
                None => segments.push(Segment::Literal(seg.to_string())),
            }
        }
        Ok(PathPattern::Segments { segments, rest })
    }

    /// True when a request path (as in its URI, percent-encoded) matches.
    pub(crate) fn matches(&self, path: &str) -> bool {
        match self {
            PathPattern::Exact(p) => path == p,
            PathPattern::Prefix(p) => path.starts_with(p.as_str()),
            PathPattern::Segments { segments, rest } => {
                let Some(mut left) = path.strip_prefix('/') else {
                    return false;
                };
                let mut more = true;
                for seg in segments {
                    if !more {
                        return false;
                    }
                    let (this, after) = match left.split_once('/') {
                        Some((this, after)) => (this, Some(after)),
                        None => (left, None),
                    };
                    let ok = match seg {
                        Segment::Literal(s) => this == s,
                        Segment::Param => !this.is_empty(),
                    };
                    if !ok {
                        return false;
                    }
                    more = after.is_some();
                    left = after.unwrap_or("");
                }
                if *rest {
                    more && !left.is_empty()
                } else {
                    !more
                }
            }
        }
    }

    /// True when every path `other` matches, this matches too (judged from what both name as
    /// fixed text; `false` when that cannot tell).
    pub(crate) fn covers(&self, other: &PathPattern) -> bool {
        if self == other {
            return true;
        }
        match (self, other) {
            (PathPattern::Exact(_) | PathPattern::Segments { .. }, PathPattern::Exact(o)) => {
                self.matches(o)
            }
            (PathPattern::Prefix(p), _) => other.fixed_start().starts_with(p.as_str()),
            _ => false,
        }
    }

    /// The text every path this matches starts with.
    fn fixed_start(&self) -> String {
        match self {
            PathPattern::Exact(p) | PathPattern::Prefix(p) => p.clone(),
            PathPattern::Segments { segments, .. } => {
                let mut start = String::from("/");
                for seg in segments {
                    match seg {
                        Segment::Literal(s) => {
                            start.push_str(s);
                            start.push('/');
                        }
                        Segment::Param => break,
                    }
                }
                start
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> PathPattern {
        PathPattern::parse(text).unwrap()
    }

    #[test]
    fn parameters_and_catch_all_match_as_axum_routes() {
        let export = p("/users/{id}/export");
        for (path, want) in [
            ("/users/42/export", true),
            ("/users/abc/export", true),
            ("/users//export", false),
            ("/users/42/export/", false),
            ("/users/42/export/x", false),
            ("/users/42", false),
            ("/users/42/exports", false),
            ("users/42/export", false),
        ] {
            assert_eq!(export.matches(path), want, "{path}");
        }
        let api = p("/api/{*rest}");
        for (path, want) in [
            ("/api/x", true),
            ("/api/x/y/z", true),
            ("/api/", false),
            ("/api", false),
            ("/apix/y", false),
        ] {
            assert_eq!(api.matches(path), want, "{path}");
        }
        let root = p("/{*rest}");
        assert!(root.matches("/a") && !root.matches("/"));
        let nested = p("/t/{tenant}/files/{*path}");
        assert!(nested.matches("/t/acme/files/a/b.txt"));
        assert!(!nested.matches("/t/acme/files/"));
        assert!(!nested.matches("/t/acme/other/a"));
        assert_eq!(p("/api/*"), PathPattern::Prefix("/api/".into()));
        assert!(p("/api/*").matches("/api/") && !p("/api/*").matches("/api"));
        assert!(p("/login").matches("/login") && !p("/login").matches("/login/"));
    }

    #[test]
    fn paths_no_request_can_have_are_errors() {
        for (text, why) in [
            ("login", "'login' must start with '/'"),
            (
                "/caf\u{e9}",
                "'/caf\u{e9}' holds '\u{e9}', which no request path has (a path is visible ASCII \
                 without '?' or '#'; percent-encode anything else as clients send it)",
            ),
            (
                "/search?q=1",
                "'/search?q=1' holds '?', which no request path has (a path is visible ASCII \
                 without '?' or '#'; percent-encode anything else as clients send it)",
            ),
            (
                "/a b",
                "'/a b' holds ' ', which no request path has (a path is visible ASCII without \
                 '?' or '#'; percent-encode anything else as clients send it)",
            ),
            (
                "/users/{}/x",
                "'/users/{}/x': '{}' is not a parameter (`{id}`)",
            ),
            (
                "/users/{id",
                "'/users/{id': a parameter is a whole segment ('/{id}/'), not '{id'",
            ),
            (
                "/file-{id}.json",
                "'/file-{id}.json': a parameter is a whole segment ('/{id}/'), not 'file-{id}.json'",
            ),
            (
                "/a/{*rest}/b",
                "'/a/{*rest}/b': the catch-all '{*rest}' must be the last segment",
            ),
            (
                "/a/{id}/*",
                "'/a/{id}/*': with parameters, end the path with `{*rest}`, not '*'",
            ),
        ] {
            assert_eq!(PathPattern::parse(text).unwrap_err(), why, "{text}");
        }
    }

    #[test]
    fn coverage_is_judged_from_fixed_text() {
        assert!(p("/health").covers(&p("/health")));
        assert!(p("/internal/*").covers(&p("/internal/metrics")));
        assert!(p("/internal/*").covers(&p("/internal/{id}")));
        assert!(p("/internal/*").covers(&p("/internal/x/*")));
        assert!(p("/users/{id}").covers(&p("/users/7")));
        assert!(!p("/internal/*").covers(&p("/{id}/internal")));
        assert!(!p("/health").covers(&p("/health/*")));
        assert!(!p("/users/{id}").covers(&p("/users/*")));
    }
}
