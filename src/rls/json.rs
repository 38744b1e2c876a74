//! Upstream's `POST /json`: a `RateLimitRequest` in protobuf's JSON mapping in, the
//! `RateLimitResponse` in it out (`overallCode`, `statuses[].currentLimit.requestsPerUnit`,
//! enum names, `"53s"` durations, defaults left out), 200 when OK and 429 when over the limit.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::config::Unit;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hitsAddend", deserialize_with = "number")]
    hits_addend: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default, alias = "hitsAddend", deserialize_with = "number")]
    hits_addend: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

/// A protobuf JSON integer: a number or a decimal string (64-bit values are written as strings).
fn number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    use serde::de::Error as _;
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| D::Error::custom(format!("expected an unsigned integer, got {n}"))),
        Some(Value::String(s)) => s
            .parse()
            .map(Some)
            .map_err(|_| D::Error::custom(format!("expected an unsigned integer, got '{s}'"))),
        Some(other) => Err(D::Error::custom(format!(
            "expected an unsigned integer, got {other}"
        ))),
    }
}

/// Parses a JSON request body.
pub(crate) fn parse_request(body: &[u8]) -> Result<RateLimitRequest, String> {
    let req: JsonRequest = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let hits = match req.hits_addend {
        None => 0,
        Some(h) => u32::try_from(h).map_err(|_| format!("hits_addend {h} is over 2^32 - 1"))?,
    };
    Ok(RateLimitRequest {
        domain: req.domain,
        descriptors: req
            .descriptors
            .into_iter()
            .map(|d| RateLimitDescriptor {
                entries: d
                    .entries
                    .into_iter()
                    .map(|e| Entry {
                        key: e.key,
                        value: e.value,
                    })
                    .collect(),
                limit: None,
                hits_addend: d.hits_addend.map(|value| UInt64Value { value }),
            })
            .collect(),
        hits_addend: hits,
    })
}

fn code_name(code: i32) -> &'static str {
    match code {
        1 => "OK",
        2 => "OVER_LIMIT",
        _ => "UNKNOWN",
    }
}

fn unit_name(unit: i32) -> &'static str {
    Unit::from_proto(unit).map_or("UNKNOWN", Unit::name)
}

/// The response in protobuf's JSON mapping (fields at their default value left out).
pub(crate) fn response_json(resp: &RateLimitResponse) -> Value {
    let statuses: Vec<Value> = resp
        .statuses
        .iter()
        .map(|s| {
            let mut m = Map::new();
            m.insert("code".into(), json!(code_name(s.code)));
            if let Some(l) = &s.current_limit {
                let mut lm = Map::new();
                if !l.name.is_empty() {
                    lm.insert("name".into(), json!(l.name));
                }
                if l.requests_per_unit != 0 {
                    lm.insert("requestsPerUnit".into(), json!(l.requests_per_unit));
                }
                lm.insert("unit".into(), json!(unit_name(l.unit)));
                m.insert("currentLimit".into(), Value::Object(lm));
            }
            if s.limit_remaining != 0 {
                m.insert("limitRemaining".into(), json!(s.limit_remaining));
            }
            if let Some(d) = &s.duration_until_reset {
                m.insert(
                    "durationUntilReset".into(),
                    json!(format!("{}s", d.seconds)),
                );
            }
            Value::Object(m)
        })
        .collect();
    let mut out = Map::new();
    out.insert("overallCode".into(), json!(code_name(resp.overall_code)));
    if !statuses.is_empty() {
        out.insert("statuses".into(), Value::Array(statuses));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_spellings_and_string_integers_parse() {
        let r = parse_request(
            br#"{"domain":"d","hitsAddend":2,"descriptors":[{"entries":[{"key":"k","value":"v"}],"hits_addend":"0"}]}"#,
        )
        .unwrap();
        assert_eq!(r.domain, "d");
        assert_eq!(r.hits_addend, 2);
        assert_eq!(r.descriptors[0].hits_addend, Some(UInt64Value { value: 0 }));
        assert_eq!(r.descriptors[0].entries[0].value, "v");
        assert!(parse_request(b"{\"domain\": 3}").is_err());
        assert!(parse_request(b"{\"nope\": 1}").is_err());
    }
}
