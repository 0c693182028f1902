//! Where `--otlp` sends profiles, resolved as OpenTelemetry SDKs resolve
//! an OTLP/HTTP exporter's endpoint and headers (the OTLP exporter
//! specification, "Configuration Options" and "Endpoint URLs for
//! OTLP/HTTP"):
//! - `--otlp URL`: URL as given, or with `/v1development/profiles` when it
//!   has no path;
//! - `--otlp` alone: `OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT` as-is (the
//!   signal's own URL), else `OTEL_EXPORTER_OTLP_ENDPOINT` with
//!   `v1development/profiles` appended to its path (a base URL), else
//!   `http://localhost:4318/v1development/profiles`;
//! - headers: `OTEL_EXPORTER_OTLP_PROFILES_HEADERS`, else
//!   `OTEL_EXPORTER_OTLP_HEADERS`, as `key=value,key2=value2` with
//!   percent-encoded values (W3C Baggage's list format), the signal's own
//!   list replacing the general one as the Python and Go SDKs do;
//! - resource: `OTEL_RESOURCE_ATTRIBUTES` (same list format) added to every
//!   process's resource, and `OTEL_SERVICE_NAME` as `service.name`, which
//!   wins over one in the list (the SDK resource specification).
//!
//! Plain http:// only: https:// is refused with a way out (a local
//! collector forwards with TLS). Headers that frame the request (`Host`,
//! `Content-Length`, `Transfer-Encoding`, ...) are the exporter's own and
//! are refused in the lists. Wherever the URL is shown (stderr, the
//! report's note, pprof comments), its query values and any user
//! information are redacted (`redacted`): a token there is a credential.

use std::fmt;

/// The signal's path on a collector (profiles_service_http.yaml).
pub const PROFILES_PATH: &str = "/v1development/profiles";

/// Where the SDKs send when nothing is configured.
pub const DEFAULT_ENDPOINT: &str = "http://localhost:4318";

/// Headers and URLs are refused past these sizes (they come from the
/// environment, and every request carries them).
const MAX_HEADERS: usize = 64;
const MAX_HEADER_BYTES: usize = 8192;
const MAX_URL_BYTES: usize = 2048;

/// A resolved OTLP/HTTP destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Destination {
    /// The URL requests go to, for messages: secrets redacted
    /// (`redacted`); `path` keeps the query that is sent.
    pub url: String,
    /// Host name or address, as in the URL (an IPv6 address without its
    /// brackets): what is connected to.
    pub host: String,
    pub port: u16,
    /// The `Host` header: the URL's authority.
    pub authority: String,
    /// The request target: path and query.
    pub path: String,
    /// Extra request headers (OTEL_EXPORTER_OTLP_*HEADERS).
    pub headers: Vec<(String, String)>,
    /// What the environment adds to every resource.
    pub resource: EnvResource,
}

/// `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`, as SDKs read them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvResource {
    /// `service.name` for every process, instead of `unknown_service:PROGRAM`.
    pub service_name: Option<String>,
    /// Other attributes, in the order given (`service.name` taken out).
    pub attributes: Vec<(String, String)>,
}

/// What went wrong, in words that say what to do.
#[derive(Debug, PartialEq, Eq)]
pub struct BadConfig(pub String);

impl fmt::Display for BadConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadConfig {}

/// The destination for `--otlp` (`flag`: its URL, or "" when given
/// alone), reading the environment through `env`.
pub fn resolve(flag: &str, env: impl Fn(&str) -> Option<String>) -> Result<Destination, BadConfig> {
    let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    for name in [
        "OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(protocol) = env(name) {
            if protocol.trim() != "http/protobuf" {
                return Err(BadConfig(format!(
                    "{name}=\"{}\": --otlp sends OTLP/HTTP protobuf only; set it to http/protobuf \
                     or unset it (a collector's otlp receiver takes both on its http endpoint, \
                     port 4318)",
                    protocol.trim()
                )));
            }
            break;
        }
    }
    let (url, source, append) = if !flag.is_empty() {
        (flag.to_string(), "--otlp", Append::IfNoPath)
    } else if let Some(url) = env("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT") {
        (url, "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", Append::Never)
    } else if let Some(url) = env("OTEL_EXPORTER_OTLP_ENDPOINT") {
        (url, "OTEL_EXPORTER_OTLP_ENDPOINT", Append::Always)
    } else {
        (
            DEFAULT_ENDPOINT.to_string(),
            "the default",
            Append::IfNoPath,
        )
    };
    let mut dest = parse_url(url.trim(), append).map_err(|why| {
        // In quotes, secrets redacted: the error is escaped once, where
        // main prints it.
        BadConfig(format!("{source} \"{}\": {why}", redacted(url.trim())))
    })?;
    let (name, headers) = match env("OTEL_EXPORTER_OTLP_PROFILES_HEADERS") {
        Some(h) => ("OTEL_EXPORTER_OTLP_PROFILES_HEADERS", h),
        None => (
            "OTEL_EXPORTER_OTLP_HEADERS",
            env("OTEL_EXPORTER_OTLP_HEADERS").unwrap_or_default(),
        ),
    };
    dest.headers = parse_headers(&headers).map_err(|why| BadConfig(format!("{name}: {why}")))?;
    dest.resource = env_resource(env)?;
    Ok(dest)
}

/// Reads `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_SERVICE_NAME`. A malformed
/// list is an error (SDKs drop it with a warning; before anything is
/// attached, an error is easier to see).
fn env_resource(env: impl Fn(&str) -> Option<String>) -> Result<EnvResource, BadConfig> {
    const NAME: &str = "OTEL_RESOURCE_ATTRIBUTES";
    let list = env(NAME).unwrap_or_default();
    let mut attributes = parse_list(&list, "resource attributes", |_| true)
        .map_err(|why| BadConfig(format!("{NAME}: {why}")))?;
    let listed = attributes
        .iter()
        .position(|(k, _)| k == "service.name")
        .map(|i| attributes.remove(i).1);
    let service_name = match env("OTEL_SERVICE_NAME") {
        Some(name) if name.len() > MAX_HEADER_BYTES || name.chars().any(char::is_control) => {
            return Err(BadConfig(format!(
                "OTEL_SERVICE_NAME: longer than {MAX_HEADER_BYTES} bytes or holds control \
                 characters"
            )))
        }
        Some(name) => Some(name.trim().to_string()),
        None => listed,
    };
    Ok(EnvResource {
        service_name,
        attributes,
    })
}

/// How the signal's path joins the URL's.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Append {
    /// A base URL: `v1development/profiles` goes after its path.
    Always,
    /// The signal's own URL, used as-is (no path: `/`).
    Never,
    /// `--otlp URL`: as-is, or the signal's path when there is none.
    IfNoPath,
}

fn parse_url(url: &str, append: Append) -> Result<Destination, String> {
    if url.len() > MAX_URL_BYTES {
        return Err(format!("longer than {MAX_URL_BYTES} bytes"));
    }
    if url
        .bytes()
        .any(|b| b.is_ascii_control() || b == b' ' || !b.is_ascii())
    {
        return Err("has spaces, control or non-ASCII characters: percent-encode them".into());
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!(
            "not a URL: write it as http://HOST:PORT, e.g. {DEFAULT_ENDPOINT} (a collector's \
             otlp receiver, http protocol)"
        ));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "http" => {}
        "https" => {
            return Err(
                "https:// is not supported: send to a collector over http:// (e.g. an \
                        OpenTelemetry collector on this host or in this pod at \
                        http://127.0.0.1:4318) and let it forward with TLS"
                    .into(),
            )
        }
        other => {
            return Err(format!(
                "scheme {other:?} is not supported: --otlp sends OTLP/HTTP to http://HOST:PORT"
            ))
        }
    }
    // The fragment is never sent.
    let rest = rest.split('#').next().unwrap_or("");
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return Err("credentials in the URL are not sent: put them in \
                    OTEL_EXPORTER_OTLP_HEADERS (e.g. Authorization=Basic%20...)"
            .into());
    }
    let (host, port) = split_host_port(authority)?;
    let path = match (append, path) {
        (Append::Always, p) => {
            let (p, query) = p.split_once('?').map_or((p, ""), |(p, q)| (p, q));
            let joined = format!("{}{PROFILES_PATH}", p.trim_end_matches('/'));
            match query {
                "" => joined,
                q => format!("{joined}?{q}"),
            }
        }
        (Append::IfNoPath, "" | "/") => PROFILES_PATH.to_string(),
        (_, p) if p.starts_with('?') => format!("/{p}"),
        (_, "") => "/".to_string(),
        (_, p) => p.to_string(),
    };
    Ok(Destination {
        url: redacted(&format!("http://{authority}{path}")),
        host,
        port,
        authority: authority.to_string(),
        path,
        headers: Vec::new(),
        resource: EnvResource::default(),
    })
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`; port 80 when absent.
fn split_host_port(authority: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or("an IPv6 address needs its closing `]`")?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("`]` must be followed by :PORT")?),
        };
        (host, port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err("no host: write it as http://HOST:PORT".into());
    }
    if !host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._:%".contains(&b))
    {
        return Err(format!("{host:?} is not a host name or address"));
    }
    let port = match port {
        None => 80,
        Some(p) => match p.parse::<u16>() {
            Ok(port) if port > 0 => port,
            _ => return Err(format!("port {p:?} is not a number from 1 to 65535")),
        },
    };
    Ok((host.to_string(), port))
}

/// Headers the exporter writes itself to frame each request and its
/// connection (RFC 9112): a second copy from the environment would be a
/// second `Content-Length` or `Host`, which servers and proxies read
/// differently (request smuggling), so the lists may not name them.
const FRAMING_HEADERS: &[&str] = &[
    "Host",
    "Content-Length",
    "Transfer-Encoding",
    "Connection",
    "Content-Type",
    "TE",
    "Trailer",
    "Upgrade",
    "Keep-Alive",
    "Expect",
];

/// `key=value,key2=value2`, values percent-decoded; an empty list is no
/// headers. A key must be an HTTP token and not one of `FRAMING_HEADERS`,
/// and no value may hold a line break (it would end the header in the
/// request).
fn parse_headers(list: &str) -> Result<Vec<(String, String)>, String> {
    let is_token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    let headers = parse_list(list, "headers", |key| key.bytes().all(is_token))?;
    for (key, _) in &headers {
        if let Some(own) = FRAMING_HEADERS.iter().find(|h| h.eq_ignore_ascii_case(key)) {
            return Err(format!(
                "\"{key}\" is a header memtrace-bpf sets itself on every request ({own}, from \
                 the URL and the body): remove it from the list"
            ));
        }
    }
    Ok(headers)
}

/// `url` as it may be shown: the values of its query (`?token=...`), any
/// user information before the host (`user:password@`) and its fragment
/// replaced by `REDACTED`. Works on malformed URLs too (error messages
/// quote what was given).
pub fn redacted(url: &str) -> String {
    const HIDDEN: &str = "REDACTED";
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), url),
    };
    let (rest, fragment) = match rest.split_once('#') {
        Some((rest, _)) => (rest, format!("#{HIDDEN}")),
        None => (rest, String::new()),
    };
    let (before_query, query) = match rest.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (rest, None),
    };
    let (authority, path) = match before_query.find('/') {
        Some(i) => before_query.split_at(i),
        None => (before_query, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((_, host)) => format!("{HIDDEN}@{host}"),
        None => authority.to_string(),
    };
    let query = query.map_or(String::new(), |q| {
        let pairs: Vec<String> = q
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) => format!("{key}={HIDDEN}"),
                None if pair.is_empty() => String::new(),
                None => HIDDEN.to_string(),
            })
            .collect();
        format!("?{}", pairs.join("&"))
    });
    format!("{scheme}{authority}{path}{query}{fragment}")
}

/// How an error quotes a malformed item: whole for resource attributes;
/// for headers only its leading name, then `…` (a header's value is often
/// a credential, and `Authorization: Bearer ...` written with a colon
/// would reach the terminal and the journal whole).
fn shown_item<'a>(item: &'a str, what: &str) -> std::borrow::Cow<'a, str> {
    if what != "headers" {
        return item.into();
    }
    let name_len = item
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        .unwrap_or(item.len())
        .min(64);
    match item.get(..name_len) {
        Some(name) if name.len() == item.len() => item.into(),
        Some(name) => format!("{name}…").into(),
        None => "…".into(),
    }
}

/// W3C Baggage's list format, as the OTEL_* variables use it: at most
/// MAX_HEADER_BYTES long, MAX_HEADERS items of `key=value` (values
/// percent-decoded, no control characters but tab), keys that `key_ok`.
fn parse_list(
    list: &str,
    what: &str,
    key_ok: impl Fn(&str) -> bool,
) -> Result<Vec<(String, String)>, String> {
    if list.len() > MAX_HEADER_BYTES {
        return Err(format!("longer than {MAX_HEADER_BYTES} bytes"));
    }
    let mut items = Vec::new();
    for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((key, value)) = item.split_once('=') else {
            return Err(format!(
                "\"{}\" is not key=value (the list is key1=value1,key2=value2)",
                shown_item(item, what)
            ));
        };
        let key = key.trim();
        if key.is_empty() || key.chars().any(char::is_control) || !key_ok(key) {
            return Err(format!(
                "\"{}\" is not {}",
                shown_item(key, what),
                match what {
                    "headers" => "an HTTP header name",
                    _ => "a valid key",
                }
            ));
        }
        let value = percent_decode(value.trim())
            .filter(|v| !v.chars().any(|c| c.is_control() && c != '\t'))
            .ok_or_else(|| {
                format!("the value of {key} is not valid percent-encoded text without line breaks")
            })?;
        items.push((key.to_string(), value));
        if items.len() > MAX_HEADERS {
            return Err(format!("more than {MAX_HEADERS} {what}"));
        }
    }
    Ok(items)
}

/// `%XX` escapes decoded; None when one is malformed or the bytes are not
/// UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b != b'%' {
            out.push(b);
            continue;
        }
        let hex = [bytes.next()?, bytes.next()?];
        let hex = std::str::from_utf8(&hex).ok()?;
        out.push(u8::from_str_radix(hex, 16).ok()?);
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests;
