use std::collections::HashMap;

use super::*;

fn with_env(flag: &str, vars: &[(&str, &str)]) -> Result<Destination, BadConfig> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    resolve(flag, |name| vars.get(name).cloned())
}

fn url(flag: &str, vars: &[(&str, &str)]) -> String {
    with_env(flag, vars).map_or_else(|e| format!("error: {e}"), |d| d.url)
}

#[test]
fn the_flag_gets_the_signal_path_only_when_it_has_none() {
    assert_eq!(
        url("http://col:4318", &[]),
        "http://col:4318/v1development/profiles"
    );
    assert_eq!(
        url("http://col:4318/", &[]),
        "http://col:4318/v1development/profiles"
    );
    assert_eq!(
        url("http://col:4318/custom/in", &[]),
        "http://col:4318/custom/in"
    );
    assert_eq!(url("HTTP://col", &[]), "http://col/v1development/profiles");
    let d = with_env("http://[::1]:9/p?x=1#frag", &[]).expect("valid");
    assert_eq!(
        (d.host.as_str(), d.port, d.path.as_str()),
        ("::1", 9, "/p?x=1")
    );
    assert_eq!(d.authority, "[::1]:9");
    let d = with_env("http://col", &[]).expect("valid");
    assert_eq!(d.port, 80);
}

#[test]
fn the_environment_is_read_as_the_sdks_read_it() {
    let base = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://gw:4318/otlp/");
    let own = ("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", "http://prof:4318");
    assert_eq!(url("", &[]), "http://localhost:4318/v1development/profiles");
    assert_eq!(
        url("", &[base]),
        "http://gw:4318/otlp/v1development/profiles"
    );
    // The signal's own URL is used as-is, and wins over the base.
    assert_eq!(url("", &[base, own]), "http://prof:4318/");
    // The command line wins over both.
    assert_eq!(
        url("http://cli:1", &[base, own]),
        "http://cli:1/v1development/profiles"
    );
    // Set but empty: as unset.
    assert_eq!(
        url("", &[("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", " ")]),
        "http://localhost:4318/v1development/profiles"
    );
}

#[test]
fn headers_are_decoded_and_the_signal_list_replaces_the_general_one() {
    let d = with_env(
        "",
        &[(
            "OTEL_EXPORTER_OTLP_HEADERS",
            "Authorization=Basic%20YWxhZGRpbjpvcGVuc2VzYW1l, x-scope-orgid = tenant-1 ,",
        )],
    )
    .expect("valid");
    assert_eq!(
        d.headers,
        vec![
            (
                "Authorization".to_string(),
                "Basic YWxhZGRpbjpvcGVuc2VzYW1l".to_string()
            ),
            ("x-scope-orgid".to_string(), "tenant-1".to_string()),
        ]
    );
    let d = with_env(
        "",
        &[
            ("OTEL_EXPORTER_OTLP_HEADERS", "a=1"),
            ("OTEL_EXPORTER_OTLP_PROFILES_HEADERS", "b=2"),
        ],
    )
    .expect("valid");
    assert_eq!(d.headers, vec![("b".to_string(), "2".to_string())]);
}

#[test]
fn bad_urls_and_headers_say_what_to_do() {
    let err = |flag: &str, vars: &[(&str, &str)]| match with_env(flag, vars) {
        Ok(d) => panic!("{flag} {vars:?} accepted: {d:?}"),
        Err(e) => e.to_string(),
    };
    assert!(err("https://col:4318", &[]).contains("https:// is not supported"));
    assert!(err("col:4318", &[]).contains("write it as http://HOST:PORT"));
    assert!(err("grpc://col", &[]).contains("scheme \"grpc\" is not supported"));
    assert!(err("http://:4318", &[]).contains("no host"));
    assert!(err("http://col:99999", &[]).contains("port \"99999\""));
    assert!(err("http://col:0", &[]).contains("port \"0\""));
    assert!(err("http://u:p@col", &[]).contains("OTEL_EXPORTER_OTLP_HEADERS"));
    assert!(err("http://co l", &[]).contains("spaces"));
    assert!(err("http://[::1", &[]).contains("closing `]`"));
    let e = err("", &[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://x")]);
    assert!(
        e.starts_with("OTEL_EXPORTER_OTLP_ENDPOINT \"https://x\": https://"),
        "{e}"
    );
    let e = err("", &[("OTEL_EXPORTER_OTLP_HEADERS", "novalue")]);
    assert!(
        e.starts_with("OTEL_EXPORTER_OTLP_HEADERS: \"novalue\" is not key=value"),
        "{e}"
    );
    // A header's value is often a credential: an error names the header,
    // never its value (`Authorization: Bearer ...` written with a colon,
    // or a base64 token whose `=` padding made the rest a key).
    for bad in [
        "Authorization:Bearer s3cr3t",
        "Authorization: Bearer s3cr3t==",
    ] {
        let e = err("", &[("OTEL_EXPORTER_OTLP_HEADERS", bad)]);
        assert!(!e.contains("s3cr3t"), "{e}");
        assert!(e.contains("\"Authorization…\""), "{e}");
    }
    // Resource attributes are no secret: quoted whole.
    let e = err("", &[("OTEL_RESOURCE_ATTRIBUTES", "k:v")]);
    assert!(e.contains("\"k:v\" is not key=value"), "{e}");
    // A decoded line break would forge a header of its own.
    let e = err("", &[("OTEL_EXPORTER_OTLP_HEADERS", "a=x%0d%0aEvil:%201")]);
    assert!(e.contains("without line breaks"), "{e}");
    assert!(err("", &[("OTEL_EXPORTER_OTLP_HEADERS", "a b=1")]).contains("not an HTTP header name"));
    assert!(err("", &[("OTEL_EXPORTER_OTLP_HEADERS", "a=%zz")]).contains("percent-encoded"));
    let e = err("", &[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]);
    assert!(e.contains("http/protobuf"), "{e}");
    assert!(with_env("", &[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")]).is_ok());
}

#[test]
fn the_environment_names_the_service_and_adds_resource_attributes() {
    let dest = with_env(
        "http://col:4318",
        &[(
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=prod, service.name=listed,team=a%20b",
        )],
    )
    .expect("valid");
    assert_eq!(dest.resource.service_name.as_deref(), Some("listed"));
    assert_eq!(
        dest.resource.attributes,
        [
            ("deployment.environment".to_string(), "prod".to_string()),
            ("team".to_string(), "a b".to_string())
        ]
    );
    // OTEL_SERVICE_NAME wins over the list's service.name.
    let dest = with_env(
        "",
        &[
            ("OTEL_RESOURCE_ATTRIBUTES", "service.name=listed"),
            ("OTEL_SERVICE_NAME", "checkout"),
        ],
    )
    .expect("valid");
    assert_eq!(dest.resource.service_name.as_deref(), Some("checkout"));
    assert!(dest.resource.attributes.is_empty());
    assert_eq!(
        with_env("", &[]).expect("valid").resource,
        EnvResource::default()
    );
    let e = error_of("", &[("OTEL_RESOURCE_ATTRIBUTES", "justakey")]);
    assert!(
        e.starts_with("OTEL_RESOURCE_ATTRIBUTES: \"justakey\" is not key=value"),
        "{e}"
    );
    let e = error_of("", &[("OTEL_RESOURCE_ATTRIBUTES", "a=%0a")]);
    assert!(e.contains("without line breaks"), "{e}");
    let e = error_of("", &[("OTEL_SERVICE_NAME", "a\u{1b}[2J")]);
    assert!(e.starts_with("OTEL_SERVICE_NAME:"), "{e}");
}

fn error_of(flag: &str, vars: &[(&str, &str)]) -> String {
    match with_env(flag, vars) {
        Ok(d) => panic!("accepted: {d:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn framing_headers_are_refused_by_name() {
    for (list, name) in [
        ("Content-Length=0", "Content-Length"),
        ("x=1,host=evil", "host"),
        ("Transfer-Encoding=chunked", "Transfer-Encoding"),
        ("CONNECTION=keep-alive", "CONNECTION"),
    ] {
        let err = with_env("http://c", &[("OTEL_EXPORTER_OTLP_HEADERS", list)])
            .expect_err("a framing header");
        assert!(
            err.0.starts_with(&format!(
                "OTEL_EXPORTER_OTLP_HEADERS: \"{name}\" is a header memtrace-bpf sets itself"
            )),
            "{list}: {err}"
        );
        assert!(err.0.contains("remove it from the list"), "{err}");
    }
    // Other headers pass, the profiles' own list is checked too.
    assert!(with_env("http://c", &[("OTEL_EXPORTER_OTLP_HEADERS", "x-host=1")]).is_ok());
    let err = with_env(
        "http://c",
        &[("OTEL_EXPORTER_OTLP_PROFILES_HEADERS", "Content-Length=5")],
    )
    .expect_err("a framing header");
    assert!(
        err.0.starts_with("OTEL_EXPORTER_OTLP_PROFILES_HEADERS: "),
        "{err}"
    );
}

#[test]
fn secrets_in_the_url_are_redacted_where_it_is_shown() {
    let d = with_env("http://col:4318/in?token=s3cret&tenant=a#frag", &[]).expect("valid");
    // Sent as given (the fragment never is), shown without the values.
    assert_eq!(d.path, "/in?token=s3cret&tenant=a");
    assert_eq!(d.url, "http://col:4318/in?token=REDACTED&tenant=REDACTED");
    let d = with_env(
        "",
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://gw:4318/otlp?apikey")],
    )
    .expect("valid");
    assert_eq!(d.path, "/otlp/v1development/profiles?apikey");
    assert_eq!(d.url, "http://gw:4318/otlp/v1development/profiles?REDACTED");
    // Errors quote the URL redacted too.
    let err = with_env("http://user:pw@col:4318/?k=v", &[]).expect_err("credentials");
    assert!(
        err.0
            .starts_with("--otlp \"http://REDACTED@col:4318/?k=REDACTED\": credentials"),
        "{err}"
    );
    let err = with_env("http://col:99999/?token=s3cret", &[]).expect_err("bad port");
    assert!(!err.0.contains("s3cret"), "{err}");
    assert_eq!(redacted("not a url?x=1&y"), "not a url?x=REDACTED&REDACTED");
    assert_eq!(redacted("http://h:1/p"), "http://h:1/p");
}
