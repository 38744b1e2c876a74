//! envoyproxy/ratelimit's YAML configuration: the files, their model, their checks, and the
//! descriptor tree a request is matched against.
//!
//! One file holds one `domain` and its nested `descriptors`; a directory is every `*.yaml` and
//! `*.yml` file in it (other files are ignored). The keys and the checks are upstream's (an
//! unknown key, an empty key, a duplicate descriptor, a bad unit, `unit` beside `unlimited`,
//! an empty or self-naming `replaces` entry, an empty or duplicate domain are errors), and every
//! error names the file and the field (`descriptors[0].rate_limit.unit`).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::Algorithm;

/// A configuration that cannot be loaded: the file and, where known, the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (or directory) at fault.
    pub file: String,
    /// The dotted path of the field at fault (`descriptors[1].rate_limit.unit`), or empty.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(f, "{}: {}: {}", self.file, self.field, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

/// A time unit of `rate_limit.unit`, as upstream measures it (a month is 30 days, a year 365).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3,600 s.
    Hour,
    /// 86,400 s.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// The unit's length in seconds (upstream's divider: windows start at multiples of it).
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The `RateLimitResponse.RateLimit.Unit` enum value on the wire.
    pub fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// The enum name upstream's JSON writes (`MINUTE`).
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }

    /// The unit of a wire enum value (`None` for UNKNOWN or a value this build does not know).
    pub fn from_proto(value: i32) -> Option<Unit> {
        [
            Unit::Second,
            Unit::Minute,
            Unit::Hour,
            Unit::Day,
            Unit::Week,
            Unit::Month,
            Unit::Year,
        ]
        .into_iter()
        .find(|u| u.proto() == value)
    }

    fn parse(s: &str) -> Option<Unit> {
        Some(match s.to_ascii_uppercase().as_str() {
            "SECOND" => Unit::Second,
            "MINUTE" => Unit::Minute,
            "HOUR" => Unit::Hour,
            "DAY" => Unit::Day,
            "WEEK" => Unit::Week,
            "MONTH" => Unit::Month,
            "YEAR" => Unit::Year,
            _ => return None,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The YAML model (upstream's keys, plus the optional `algorithm` and `burst`).
// ---------------------------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlRoot {
    #[serde(default, deserialize_with = "scalar")]
    domain: String,
    #[serde(default)]
    descriptors: Option<Vec<YamlDescriptor>>,
    /// Extra: a request's descriptors in this domain are admitted all together or not at all.
    #[serde(default)]
    check_all: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlDescriptor {
    #[serde(default, deserialize_with = "scalar")]
    key: String,
    #[serde(default, deserialize_with = "scalar")]
    value: String,
    rate_limit: Option<YamlRateLimit>,
    #[serde(default)]
    descriptors: Option<Vec<YamlDescriptor>>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
    #[serde(default)]
    value_to_metric: bool,
    #[serde(default)]
    share_threshold: bool,
    #[serde(default)]
    quota_mode: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlRateLimit {
    #[serde(default)]
    requests_per_unit: u32,
    #[serde(default, deserialize_with = "scalar")]
    unit: String,
    #[serde(default)]
    unlimited: bool,
    #[serde(default, deserialize_with = "scalar")]
    name: String,
    #[serde(default)]
    replaces: Vec<YamlReplaces>,
    /// Extra: the engine's algorithm for this limit (default: upstream's fixed window).
    algorithm: Option<String>,
    /// Extra: the bucket algorithms' burst (default: `requests_per_unit`).
    burst: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlReplaces {
    #[serde(default, deserialize_with = "scalar")]
    name: String,
}

/// A YAML scalar read as text, as upstream's Go YAML reads `value: 123` into a string field.
fn scalar<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    use serde::de::Error as _;
    match serde_norway::Value::deserialize(d)? {
        serde_norway::Value::Null => Ok(String::new()),
        serde_norway::Value::String(s) => Ok(s),
        serde_norway::Value::Number(n) => Ok(n.to_string()),
        serde_norway::Value::Bool(b) => Ok(b.to_string()),
        other => Err(D::Error::custom(format!(
            "expected a string, found {}",
            match other {
                serde_norway::Value::Sequence(_) => "a list",
                serde_norway::Value::Mapping(_) => "a map",
                _ => "a tagged value",
            }
        ))),
    }
}

// ---------------------------------------------------------------------------------------------
// The compiled model.
// ---------------------------------------------------------------------------------------------

/// One `rate_limit` of the configuration, as the service applies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimit {
    /// Upstream's full key: the domain and the descriptor path (`rl.foo.bar_banned`); the stats
    /// are counted under it, and the engine's plan for it is named by it.
    pub full_key: String,
    /// `requests_per_unit`.
    pub requests_per_unit: u32,
    /// `unit` (`None` for an unlimited entry).
    pub unit: Option<Unit>,
    /// `unlimited: true`: always OK, never counted.
    pub unlimited: bool,
    /// `shadow_mode: true`: counted and reported in the stats, but always answered OK.
    pub shadow_mode: bool,
    /// `name`, for `replaces`.
    pub name: String,
    /// The names of the limits this one replaces when both apply to one request.
    pub replaces: Vec<String>,
    /// `detailed_metric: true`: stats per request value rather than per config entry.
    pub detailed_metric: bool,
    /// Extra: the engine's algorithm (`None`: upstream's fixed window).
    pub algorithm: Option<Algorithm>,
    /// Extra: the bucket algorithms' burst.
    pub burst: Option<u64>,
    /// Extra: the limit's domain is `check_all` (all of a request's descriptors or none).
    pub check_all: bool,
}

impl RateLimit {
    /// The window (or period) of the limit.
    pub fn period(&self) -> Duration {
        Duration::from_secs(self.unit.map_or(1, Unit::seconds))
    }
}

/// One level of a descriptor tree.
#[derive(Debug, Default, Clone)]
pub(crate) struct Node {
    /// Children by `key` or `key_value`.
    pub(crate) children: HashMap<String, Node>,
    /// Children whose value ends in `*`, in config order: (`key_prefix`, the child's map key).
    pub(crate) wildcards: Vec<(String, String)>,
    /// The limit at this level, if any.
    pub(crate) limit: Option<Arc<RateLimit>>,
    /// `value_to_metric` on this entry.
    pub(crate) value_to_metric: bool,
    /// `share_threshold` on this (wildcard) entry: every value it matches shares one counter.
    pub(crate) share_threshold: bool,
    /// At a domain's root: the extra `check_all` (all descriptors admitted or none charged).
    pub(crate) check_all: bool,
}

/// A loaded configuration: every domain's descriptor tree.
#[derive(Debug, Default, Clone)]
pub struct RlsConfig {
    pub(crate) domains: HashMap<String, Node>,
}

impl RlsConfig {
    /// Loads one YAML file, or every `*.yaml` / `*.yml` file of a directory (in name order).
    pub fn load(path: &Path) -> Result<RlsConfig, ConfigError> {
        let sources = read_sources(path)?;
        RlsConfig::from_sources(&sources)
    }

    /// Parses (file name, contents) pairs, one domain each.
    pub fn from_sources(sources: &[(String, String)]) -> Result<RlsConfig, ConfigError> {
        let mut config = RlsConfig::default();
        for (file, text) in sources {
            config.add_file(file, text)?;
        }
        Ok(config)
    }

    /// Whether `domain` is all-or-nothing across a request's descriptors (`check_all: true`).
    pub fn is_check_all(&self, domain: &str) -> bool {
        self.domains.get(domain).is_some_and(|n| n.check_all)
    }

    /// The domains configured, sorted.
    pub fn domains(&self) -> Vec<String> {
        let mut d: Vec<String> = self.domains.keys().cloned().collect();
        d.sort();
        d
    }

    /// Every limit of the configuration (unlimited ones included), in no particular order.
    pub fn limits(&self) -> Vec<Arc<RateLimit>> {
        fn walk(node: &Node, out: &mut Vec<Arc<RateLimit>>) {
            if let Some(l) = &node.limit {
                out.push(l.clone());
            }
            for child in node.children.values() {
                walk(child, out);
            }
        }
        let mut out = Vec::new();
        for node in self.domains.values() {
            walk(node, &mut out);
        }
        out
    }

    fn add_file(&mut self, file: &str, text: &str) -> Result<(), ConfigError> {
        let err = |field: &str, message: String| ConfigError {
            file: file.to_string(),
            field: field.to_string(),
            message,
        };
        let de = serde_norway::Deserializer::from_str(text);
        let root: YamlRoot = serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string().replace('?', "");
            let field = field.trim_matches('.');
            // serde_norway starts its message with the path too: say it once.
            let message = e.inner().to_string();
            let message = match message.split_once(": ") {
                Some((path, rest)) if !path.contains(' ') => rest.to_string(),
                _ => message,
            };
            err(field, message)
        })?;
        if root.domain.is_empty() {
            return Err(err("domain", "config file cannot have empty domain".into()));
        }
        if self.domains.contains_key(&root.domain) {
            return Err(err(
                "domain",
                format!("duplicate domain '{}' in config file", root.domain),
            ));
        }
        let mut node = Node {
            check_all: root.check_all,
            ..Node::default()
        };
        let ctx = Ctx {
            file,
            err: &err,
            check_all: root.check_all,
        };
        ctx.load(
            &mut node,
            &format!("{}.", root.domain),
            "descriptors",
            root.descriptors.unwrap_or_default(),
        )?;
        self.domains.insert(root.domain, node);
        Ok(())
    }
}

/// What `load` needs to build errors.
struct Ctx<'a> {
    file: &'a str,
    err: &'a dyn Fn(&str, String) -> ConfigError,
    /// The domain is `check_all`.
    check_all: bool,
}

impl Ctx<'_> {
    fn load(
        &self,
        node: &mut Node,
        parent_key: &str,
        field: &str,
        descriptors: Vec<YamlDescriptor>,
    ) -> Result<(), ConfigError> {
        for (i, d) in descriptors.into_iter().enumerate() {
            let at = format!("{field}[{i}]");
            if d.key.is_empty() {
                return Err((self.err)(
                    &format!("{at}.key"),
                    "descriptor has empty key".into(),
                ));
            }
            let final_key = if d.value.is_empty() {
                d.key.clone()
            } else {
                format!("{}_{}", d.key, d.value)
            };
            let full_key = format!("{parent_key}{final_key}");
            if node.children.contains_key(&final_key) {
                return Err((self.err)(
                    &at,
                    format!("duplicate descriptor composite key '{full_key}'"),
                ));
            }
            if d.share_threshold && !final_key.ends_with('*') {
                return Err((self.err)(
                    &format!("{at}.share_threshold"),
                    format!(
                        "share_threshold can only be used with wildcard values (ending with \
                         '*'), but found key '{final_key}'"
                    ),
                ));
            }
            if d.quota_mode {
                eprintln!(
                    "tollgate rls: {}: {at}.quota_mode is accepted and answered as a plain limit",
                    self.file
                );
            }
            let limit = match d.rate_limit {
                Some(rl) => Some(Arc::new(self.rate_limit(
                    rl,
                    &format!("{at}.rate_limit"),
                    full_key.clone(),
                    d.shadow_mode,
                    d.detailed_metric,
                )?)),
                None => None,
            };
            let mut child = Node {
                limit,
                value_to_metric: d.value_to_metric,
                share_threshold: d.share_threshold,
                ..Node::default()
            };
            self.load(
                &mut child,
                &format!("{full_key}."),
                &format!("{at}.descriptors"),
                d.descriptors.unwrap_or_default(),
            )?;
            if let Some(prefix) = final_key.strip_suffix('*') {
                node.wildcards.push((prefix.to_string(), final_key.clone()));
            }
            node.children.insert(final_key, child);
        }
        Ok(())
    }

    fn rate_limit(
        &self,
        rl: YamlRateLimit,
        at: &str,
        full_key: String,
        shadow_mode: bool,
        detailed_metric: bool,
    ) -> Result<RateLimit, ConfigError> {
        let unit = if rl.unit.is_empty() {
            None
        } else {
            Unit::parse(&rl.unit)
        };
        if rl.unlimited {
            if unit.is_some() {
                return Err((self.err)(
                    &format!("{at}.unit"),
                    "should not specify rate limit unit when unlimited".into(),
                ));
            }
        } else if unit.is_none() {
            return Err((self.err)(
                &format!("{at}.unit"),
                format!("invalid rate limit unit '{}'", rl.unit),
            ));
        }
        for (j, r) in rl.replaces.iter().enumerate() {
            if r.name.is_empty() {
                return Err((self.err)(
                    &format!("{at}.replaces[{j}].name"),
                    "should not have an empty replaces entry".into(),
                ));
            }
            if r.name == rl.name {
                return Err((self.err)(
                    &format!("{at}.replaces[{j}].name"),
                    "replaces should not contain name of same descriptor".into(),
                ));
            }
        }
        let algorithm = match &rl.algorithm {
            None => None,
            Some(name) => Some(Algorithm::from_name(name).ok_or_else(|| {
                let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
                (self.err)(
                    &format!("{at}.algorithm"),
                    format!("unknown algorithm '{name}' (one of: {})", names.join(", ")),
                )
            })?),
        };
        if rl.burst == Some(0) {
            return Err((self.err)(
                &format!("{at}.burst"),
                "burst must be at least 1".into(),
            ));
        }
        if self.check_all && shadow_mode {
            return Err((self.err)(
                &at.replace(".rate_limit", ".shadow_mode"),
                "shadow_mode cannot be combined with the domain's check_all".into(),
            ));
        }
        if !rl.unlimited && rl.requests_per_unit == 0 && (algorithm.is_some() || self.check_all) {
            return Err((self.err)(
                &format!("{at}.requests_per_unit"),
                "a limit of 0 is only for upstream's fixed window (it answers OVER_LIMIT \
                 always); the engine's algorithms and check_all need at least 1"
                    .into(),
            ));
        }
        Ok(RateLimit {
            full_key,
            requests_per_unit: rl.requests_per_unit,
            unit,
            unlimited: rl.unlimited,
            shadow_mode,
            name: rl.name,
            replaces: rl.replaces.into_iter().map(|r| r.name).collect(),
            detailed_metric,
            algorithm,
            burst: rl.burst,
            check_all: self.check_all,
        })
    }
}

/// The (file name, contents) of a config path: the file itself, or a directory's `*.yaml` and
/// `*.yml` files in name order.
pub fn read_sources(path: &Path) -> Result<Vec<(String, String)>, ConfigError> {
    let io_err = |p: &Path, e: std::io::Error| ConfigError {
        file: p.display().to_string(),
        field: String::new(),
        message: format!("cannot read: {e}"),
    };
    let meta = std::fs::metadata(path).map_err(|e| io_err(path, e))?;
    let files: Vec<PathBuf> = if meta.is_dir() {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(path).map_err(|e| io_err(path, e))? {
            let p = entry.map_err(|e| io_err(path, e))?.path();
            let yaml = p
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| e == "yaml" || e == "yml");
            if yaml && p.is_file() {
                files.push(p);
            }
        }
        files.sort();
        files
    } else {
        vec![path.to_path_buf()]
    };
    let mut out = Vec::with_capacity(files.len());
    for f in files {
        match std::fs::read_to_string(&f) {
            Ok(text) => out.push((f.display().to_string(), text)),
            // Removed between the listing and the read (a rename in progress): skipped now,
            // read at the next look.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && meta.is_dir() => {}
            Err(e) => return Err(io_err(&f, e)),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(files: &[(&str, &str)]) -> Result<RlsConfig, String> {
        let sources: Vec<(String, String)> = files
            .iter()
            .map(|(f, t)| (f.to_string(), t.to_string()))
            .collect();
        RlsConfig::from_sources(&sources).map_err(|e| e.to_string())
    }

    #[test]
    fn upstreams_checks_name_the_file_and_field() {
        let cases = [
            (
                "descriptors: []",
                "f.yaml: domain: config file cannot have empty domain",
            ),
            (
                "domain: d\ndescriptors: [{value: v}]",
                "f.yaml: descriptors[0].key: descriptor has empty key",
            ),
            (
                "domain: d\ndescriptors: [{key: k, value: v}, {key: k, value: v}]",
                "f.yaml: descriptors[1]: duplicate descriptor composite key 'd.k_v'",
            ),
            (
                "domain: d\ndescriptors: [{key: k, rate_limit: {unlimited: true, unit: hour}}]",
                "f.yaml: descriptors[0].rate_limit.unit: should not specify rate limit unit when unlimited",
            ),
            (
                "domain: d\ndescriptors: [{key: k, rate_limit: {requests_per_unit: 1}}]",
                "f.yaml: descriptors[0].rate_limit.unit: invalid rate limit unit ''",
            ),
            (
                "domain: d\ndescriptors: [{key: k, rate_limit: {unit: hour, name: a, replaces: [{name: a}]}}]",
                "f.yaml: descriptors[0].rate_limit.replaces[0].name: replaces should not contain name of same descriptor",
            ),
            (
                "domain: d\ndescriptors: [{key: k, rate_limit: {unit: hour, algorithm: magic}}]",
                "f.yaml: descriptors[0].rate_limit.algorithm: unknown algorithm 'magic'",
            ),
            (
                "domain: d\ndescriptors: [{key: k, value: v, share_threshold: true}]",
                "f.yaml: descriptors[0].share_threshold: share_threshold can only be used with wildcard values",
            ),
        ];
        for (yaml, want) in cases {
            let err = load(&[("f.yaml", yaml)]).unwrap_err();
            assert!(err.starts_with(want), "{yaml}\n got: {err}\nwant: {want}");
        }
        let dup = "domain: d\n";
        assert_eq!(
            load(&[("a.yaml", dup), ("b.yaml", dup)]).unwrap_err(),
            "b.yaml: domain: duplicate domain 'd' in config file"
        );
    }

    #[test]
    fn scalars_units_and_extras_parse() {
        let c = load(&[(
            "f.yaml",
            "domain: 7\ndescriptors:\n  - key: status\n    value: 404\n    rate_limit: {unit: MONTH, requests_per_unit: 3, algorithm: token_bucket, burst: 2}\n",
        )])
        .unwrap();
        assert_eq!(c.domains(), ["7"]);
        let l = &c.limits()[0];
        assert_eq!(l.full_key, "7.status_404");
        assert_eq!(l.unit, Some(Unit::Month));
        assert_eq!(l.period(), Duration::from_secs(30 * 86_400));
        assert_eq!(
            (l.algorithm, l.burst),
            (Some(Algorithm::TokenBucket), Some(2))
        );
        assert_eq!(Unit::Year.seconds(), 365 * 86_400);
        assert_eq!(Unit::from_proto(Unit::Week.proto()), Some(Unit::Week));
    }

    #[test]
    fn a_directory_is_its_yaml_files_in_name_order() {
        let dir = std::env::temp_dir().join(format!("tollgate-rls-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("b.yml"), "domain: b\n").unwrap();
        std::fs::write(dir.join("a.yaml"), "domain: a\n").unwrap();
        std::fs::write(dir.join("notes.txt"), "not: [yaml").unwrap();
        let sources = read_sources(&dir).unwrap();
        let names: Vec<&str> = sources
            .iter()
            .map(|(f, _)| f.rsplit('/').next().unwrap())
            .collect();
        assert_eq!(names, ["a.yaml", "b.yml"]);
        assert_eq!(RlsConfig::load(&dir).unwrap().domains(), ["a", "b"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
