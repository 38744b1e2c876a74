//! gRPC answers: a denial seen by a tonic (or any gRPC) client is a status, not an HTTP 429.
//!
//! A gRPC request (content type `application/grpc...`) that the layer answers itself gets a
//! Trailers-Only response: HTTP 200, `grpc-status`, a percent-encoded `grpc-message`, and for a
//! denial the retry delay twice: as `retry-after` metadata (whole seconds, like the HTTP
//! header) and as the standard `google.rpc.RetryInfo` detail in `grpc-status-details-bin`
//! (exact to the nanosecond). The protobuf is written by hand: three tiny messages; the base64
//! and the percent-encoding are the `base64` and `percent-encoding` crates'.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::Full;
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};

/// `RESOURCE_EXHAUSTED`: the code for a rate limit.
pub(crate) const RESOURCE_EXHAUSTED: u32 = 8;
/// `INVALID_ARGUMENT`: a request whose client key cannot be taken.
pub(crate) const INVALID_ARGUMENT: u32 = 3;
/// `INTERNAL`: a limiter mistake.
pub(crate) const INTERNAL: u32 = 13;

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_DETAILS: HeaderName = HeaderName::from_static("grpc-status-details-bin");

/// True for a gRPC request (`application/grpc`, `application/grpc+proto`, ...).
pub(crate) fn is_grpc(parts: &http::request::Parts) -> bool {
    parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A Trailers-Only gRPC response with status `code`, `message`, and for a denial its retry
/// delay in nanoseconds.
pub(crate) fn status(code: u32, message: &str, retry_ns: Option<u64>) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    h.insert(GRPC_STATUS, HeaderValue::from(code));
    if let Ok(v) = HeaderValue::from_str(&percent_encode(message)) {
        h.insert(GRPC_MESSAGE, v);
    }
    if let Some(ns) = retry_ns {
        let details = base64(&status_proto(code, message, ns));
        if let Ok(v) = HeaderValue::from_str(&details) {
            h.insert(GRPC_DETAILS, v);
        }
    }
    resp
}

/// What `grpc-message` percent-encodes: every byte outside printable ASCII (the controls, and
/// all of non-ASCII, are in `CONTROLS`), and `%` itself (the gRPC HTTP/2 spec).
const GRPC_MESSAGE_SET: &AsciiSet = &CONTROLS.add(b'%');

/// `grpc-message` encoding: bytes outside printable ASCII, and `%`, as `%XX`.
fn percent_encode(text: &str) -> String {
    utf8_percent_encode(text, GRPC_MESSAGE_SET).to_string()
}

/// `google.rpc.Status { code, message, details: [Any(google.rpc.RetryInfo { retry_delay })] }`.
fn status_proto(code: u32, message: &str, retry_ns: u64) -> Vec<u8> {
    // google.protobuf.Duration { int64 seconds = 1; int32 nanos = 2; } (zero fields omitted).
    let mut duration = Vec::new();
    let (secs, nanos) = (retry_ns / 1_000_000_000, retry_ns % 1_000_000_000);
    if secs > 0 {
        varint_field(&mut duration, 1, secs);
    }
    if nanos > 0 {
        varint_field(&mut duration, 2, nanos);
    }
    // google.rpc.RetryInfo { Duration retry_delay = 1; }
    let mut retry_info = Vec::new();
    bytes_field(&mut retry_info, 1, &duration);
    // google.protobuf.Any { string type_url = 1; bytes value = 2; }
    let mut any = Vec::new();
    bytes_field(&mut any, 1, b"type.googleapis.com/google.rpc.RetryInfo");
    bytes_field(&mut any, 2, &retry_info);
    // google.rpc.Status { int32 code = 1; string message = 2; repeated Any details = 3; }
    let mut status = Vec::new();
    varint_field(&mut status, 1, u64::from(code));
    bytes_field(&mut status, 2, message.as_bytes());
    bytes_field(&mut status, 3, &any);
    status
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A varint field (wire type 0).
fn varint_field(out: &mut Vec<u8>, field: u64, v: u64) {
    varint(out, field << 3);
    varint(out, v);
}

/// A length-delimited field (wire type 2).
fn bytes_field(out: &mut Vec<u8>, field: u64, v: &[u8]) {
    varint(out, (field << 3) | 2);
    varint(out, v.len() as u64);
    out.extend_from_slice(v);
}

/// Standard base64 without padding (binary gRPC metadata; readers accept it with or without).
fn base64(data: &[u8]) -> String {
    STANDARD_NO_PAD.encode(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648_vectors_without_padding() {
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg"),
            ("fo", "Zm8"),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg"),
            ("fooba", "Zm9vYmE"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), coded, "{plain}");
        }
        assert_eq!(base64(&[0xfb, 0xff]), "+/8");
    }

    #[test]
    fn status_proto_bytes() {
        // code 8, "x", retry 1.5 s, written out field by field: Status { 1: 8, 2: "x", 3: Any {
        // 1: type url (40 bytes), 2: RetryInfo { 1: Duration { 1: 1, 2: 500_000_000 } } } }.
        let want: Vec<u8> = [
            &[0x08, 8, 0x12, 1, b'x', 0x1a, 54, 0x0a, 40][..],
            b"type.googleapis.com/google.rpc.RetryInfo",
            &[
                0x12, 10, 0x0a, 8, 0x08, 1, 0x10, 0x80, 0xca, 0xb5, 0xee, 0x01,
            ][..],
        ]
        .concat();
        assert_eq!(status_proto(8, "x", 1_500_000_000), want);
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("50% off\n"), "50%25 off%0A");
        assert_eq!(percent_encode("é"), "%C3%A9");
        assert_eq!(percent_encode("a\u{7f}~ "), "a%7F~ ");
    }
}
