//! Fuzzing the parsers that face the internet (issue 20): the path and query of every request,
//! JSON bodies, job specs, the clusters file and the simulated inventory, the billing
//! export writers, the client's event-stream parser, pod logs read from a cluster, CI trust
//! policies' claim patterns and the token exchange's parameters.
//!
//! Each property first runs the seed inputs kept in `tests/fuzz/<target>/` (among them every
//! input that once found a bug), then `FAIRWAY_FUZZ_CASES` random cases (default
//! [`DEFAULT_CASES`], which keeps the whole file within seconds of CI time). A failing case is
//! shrunk, printed, and saved in `tests/fuzz.proptest-regressions`, which is replayed first
//! from then on. `tests/fuzz/README.md` says what each corpus holds and how to run longer.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use axum::{body::Body, http::Request, Router};
use chrono::{DateTime, Duration, NaiveDate, TimeZone as _, Utc};
use fairway::{
    api::{
        billing::{ExportParams, UsageParams},
        jobs::JobListParams,
    },
    backends::{
        clusters::{self, ClusterConfig},
        sim::{SimConfig, SimConfigError},
    },
    billing::export::{Exporter, Format, FOCUS_COLUMNS},
    db::billing::ExportRow,
    domain::{
        check_range,
        job::{check_command, check_env, check_expected_runtime, check_grace, check_image, check_labels, check_name},
        ClusterName, FieldError, JobId, TeamId,
    },
    http::{
        error::ApiError,
        extract::{parse_json, query},
        hostile::refuse_unstorable_text,
    },
    ops::{jobs::JobSpec, priority_classes::NewPriorityClass, quotas::QuotaSpec, teams::NewTeam},
};
use proptest::{
    collection::{btree_map, vec},
    option,
    prelude::*,
    sample::select,
    strategy::Union,
    test_runner::{Config, FileFailurePersistence, RngSeed, TestCaseError, TestRunner},
};
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};
use tower::ServiceExt as _;

// ---------------------------------------------------------------------------------------------
// The harness: corpus first, then random cases.
// ---------------------------------------------------------------------------------------------

/// Random cases per property when `FAIRWAY_FUZZ_CASES` is unset.
const DEFAULT_CASES: u32 = 2_000;

fn cases() -> u32 {
    match std::env::var("FAIRWAY_FUZZ_CASES") {
        Ok(text) => text.parse().unwrap_or_else(|_| panic!("FAIRWAY_FUZZ_CASES={text:?} is not a number")),
        Err(_) => DEFAULT_CASES,
    }
}

/// Where the random cases come from. The test command's run (no `FAIRWAY_FUZZ_CASES`) uses
/// a fixed seed, so CI checks the same inputs every time and a change, not luck, turns it
/// red; a longer local run (`FAIRWAY_FUZZ_CASES=...`) draws fresh ones, or replays a run with
/// `FAIRWAY_FUZZ_SEED=<n>`.
fn rng_seed() -> RngSeed {
    if let Ok(text) = std::env::var("FAIRWAY_FUZZ_SEED") {
        return RngSeed::Fixed(text.parse().unwrap_or_else(|_| panic!("FAIRWAY_FUZZ_SEED={text:?} is not a number")));
    }
    if std::env::var_os("FAIRWAY_FUZZ_CASES").is_some() {
        RngSeed::Random
    } else {
        RngSeed::Fixed(0x00f0_220e)
    }
}

/// The seed inputs of one target (`tests/fuzz/<target>/*`), by file name, in name order.
fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz").join(target);
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|entry| entry.expect("a corpus entry").path())
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "corpus {} is empty", dir.display());
    paths
        .into_iter()
        .map(|path| {
            let name = path.file_name().expect("a file name").to_string_lossy().into_owned();
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (name, bytes)
        })
        .collect()
}

/// The seeds of `target` as text, without the final newline an editor adds.
fn text_corpus(target: &str) -> Vec<(String, String)> {
    corpus(target)
        .into_iter()
        .map(|(name, bytes)| {
            let text = String::from_utf8(bytes).unwrap_or_else(|_| panic!("{target}/{name} is not UTF-8"));
            let text = match text.strip_suffix('\n') {
                Some(line) => line.to_owned(),
                None => text,
            };
            (name, text)
        })
        .collect()
}

/// Runs `check` on every seed, then on random values of `strategy`; a failure panics with
/// the seed's name or the shrunk random input.
fn fuzz<S>(seeds: Vec<(String, S::Value)>, strategy: S, check: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S: Strategy,
{
    for (name, seed) in seeds {
        if let Err(failure) = check(seed) {
            panic!("corpus file {name}: {failure}");
        }
    }
    let mut config = Config::with_cases(cases());
    config.rng_seed = rng_seed();
    config.source_file = Some(file!());
    // `tests/fuzz.proptest-regressions`, committed: every failure found is replayed first.
    config.failure_persistence = Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions")));
    if let Err(failure) = TestRunner::new(config).run(&strategy, check) {
        panic!("{failure}");
    }
}

// ---------------------------------------------------------------------------------------------
// Path and query: `http::hostile` and `http::extract::query`.
// ---------------------------------------------------------------------------------------------

/// Characters a request target may carry as they are (RFC 3986 `pchar` and `/`).
const PATH_CHARS: &str = "abcxyzABZ0189-._~!$&'()*+,;=:@/";
/// The same for a query's keys and values (`&` and `=` separate them).
const QUERY_CHARS: &str = "abcxyzABZ0189-._~!$'()*+,;:@/?";

/// A piece of a percent-encoded path or query that decodes to storable text: plain
/// characters, escapes of ASCII bytes other than NUL, the UTF-8 of any character, and `%`
/// signs that escape nothing.
fn clean_piece(plain: &'static str) -> impl Strategy<Value = String> {
    prop_oneof![
        8 => select(plain.chars().collect::<Vec<_>>()).prop_map(String::from),
        2 => (1_u8..0x80).prop_map(|b| format!("%{b:02X}")),
        2 => any::<char>()
            .prop_filter("not NUL", |&c| c != '\0')
            .prop_map(|c| c.to_string().bytes().map(|b| format!("%{b:02x}")).collect()),
        1 => select(vec!["%", "%%", "%0", "%g0", "%0g", "%2500"]).prop_map(String::from),
    ]
}

/// A piece of a percent-encoded path or query: plain characters, escapes of any byte (NUL and
/// bytes that break UTF-8 often), the UTF-8 of any character, and `%` signs that escape nothing.
fn encoded_piece(plain: &'static str) -> impl Strategy<Value = String> {
    prop_oneof![
        6 => select(plain.chars().collect::<Vec<_>>()).prop_map(String::from),
        2 => any::<u8>().prop_map(|b| format!("%{b:02X}")),
        1 => any::<u8>().prop_map(|b| format!("%{b:02x}")),
        2 => select(vec![0x00_u8, 0x80, 0xBF, 0xC0, 0xC3, 0xE2, 0xED, 0xF0, 0xF4, 0xF5, 0xFF])
            .prop_map(|b| format!("%{b:02X}")),
        2 => any::<char>().prop_map(|c| c.to_string().bytes().map(|b| format!("%{b:02X}")).collect()),
        1 => select(vec!["%", "%%", "%0", "%g0", "%0g", "%%00", "%2500", "%C3", "%ED%A0%80", "%C0%80"])
            .prop_map(String::from),
    ]
}

/// Paths and queries each storable about half the time.
fn request_targets() -> impl Strategy<Value = String> {
    let part = |plain| {
        prop_oneof![vec(clean_piece(plain), 0..20), vec(encoded_piece(plain), 0..20)].prop_map(|pieces| pieces.concat())
    };
    let path = part(PATH_CHARS).prop_map(|path| format!("/{path}"));
    let query = option::of(part(QUERY_CHARS));
    (path, query).prop_map(|(path, query)| match query {
        Some(query) => format!("{path}?{query}"),
        None => path,
    })
}

/// `raw` with every `%` and two hex digits replaced by that byte; written here apart from
/// the middleware's own decoder, as the rule a reader of RFC 3986 would apply.
fn percent_decoded(raw: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = raw.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        if let (b'%', [high, low, after @ ..]) = (first, tail) {
            if let (Some(high), Some(low)) = (char::from(*high).to_digit(16), char::from(*low).to_digit(16)) {
                out.push(u8::try_from(high * 16 + low).expect("two hex digits make a byte"));
                rest = after;
                continue;
            }
        }
        out.push(first);
        rest = tail;
    }
    out
}

/// Whether PostgreSQL `text` could hold `raw` once decoded: UTF-8 without NUL.
fn storable(raw: &str) -> bool {
    let decoded = percent_decoded(raw);
    !decoded.contains(&0) && std::str::from_utf8(&decoded).is_ok()
}

/// What the handler behind the middleware answers.
const REACHED: &str = "reached the handler";

#[test]
fn a_path_or_query_that_decodes_to_nul_or_invalid_utf8_is_a_400_naming_it_and_nothing_else_is_stopped() {
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
    let router = Router::new().fallback(|| async { REACHED }).layer(axum::middleware::from_fn(refuse_unstorable_text));
    let seeds = text_corpus("paths");
    fuzz(seeds, request_targets(), |target| {
        let request = Request::builder()
            .uri(target.as_str())
            .body(Body::empty())
            .map_err(|e| TestCaseError::fail(format!("no request can carry {target:?}: {e}")))?;
        let uri = request.uri().clone();
        let response = runtime.block_on(router.clone().oneshot(request)).expect("the router is infallible");
        let status = response.status();
        let content_type = response.headers().get("content-type").map(|v| v.to_str().unwrap_or("?").to_owned());
        let body = runtime.block_on(axum::body::to_bytes(response.into_body(), usize::MAX)).expect("a body");
        prop_assert!(!status.is_server_error(), "{target:?} answered {status}");
        let refused = if !storable(uri.path()) {
            Some("path")
        } else if !storable(uri.query().unwrap_or("")) {
            Some("query")
        } else {
            None
        };
        match refused {
            Some(part) => {
                prop_assert_eq!(status.as_u16(), 400, "{:?} must be refused for its {}", target, part);
                prop_assert_eq!(content_type.as_deref(), Some("application/problem+json"));
                let problem: Value = serde_json::from_slice(&body).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(&problem["code"], "malformed_request");
                prop_assert_eq!(&problem["field"], part, "{}", problem);
            }
            None => {
                prop_assert_eq!(status.as_u16(), 200, "{:?} is storable and must reach the handler", target);
                prop_assert_eq!(&body[..], REACHED.as_bytes());
            }
        }
        Ok(())
    });
}

/// Parameter names the three query types below know, and some they do not.
const QUERY_KEYS: [&str; 13] = [
    "state",
    "gpu_class",
    "label",
    "limit",
    "cursor",
    "period",
    "format",
    "from",
    "to",
    "step",
    "group_by",
    "lim%69t",
    "limit%00",
];

fn query_strings() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        4 => select(QUERY_KEYS.to_vec()).prop_map(String::from),
        2 => vec(encoded_piece(QUERY_CHARS), 0..6).prop_map(|pieces| pieces.concat()),
        1 => select(vec!["", "%60", "a%60b", "%60%2C%20expected%20%60x", "a%3Db", "a%26b"]).prop_map(String::from),
    ];
    let value = prop_oneof![
        2 => any::<i64>().prop_map(|n| n.to_string()),
        1 => (0_i64..300).prop_map(|n| n.to_string()),
        2 => select(vec![
            "pending", "running", "csv", "json", "focus", "xlsx", "2026-11", "2026-13", "2026-11-05T10:00:00Z",
            "2026-11-05T10:00:00%2B02:00", "day", "hour", "label:team", "99999999999999999999", "1e3", "-0",
        ])
        .prop_map(String::from),
        3 => vec(encoded_piece(QUERY_CHARS), 0..8).prop_map(|pieces| pieces.concat()),
    ];
    let pair = prop_oneof![
        8 => (key.clone(), value).prop_map(|(k, v)| format!("{k}={v}")),
        1 => key,
        1 => select(vec!["", "=", "==", "a=b=c"]).prop_map(String::from),
    ];
    let pairs = vec(pair, 0..6).prop_map(|pairs| pairs.join("&"));
    // An export's parameters, complete but for what goes wrong with them.
    let export = (select(vec!["csv", "json", "focus", "xlsx", "CSV"]), select(vec!["2026-11", "", "%FF", "period"]))
        .prop_map(|(format, period)| format!("period={period}&format={format}"));
    prop_oneof![4 => pairs, 1 => export]
}

/// Checks one query type: an error is a 422 that names a parameter the query carries, or a
/// required one it lacks. Returns the parsed parameters.
fn check_query<T: serde::de::DeserializeOwned>(
    uri: &axum::http::Uri,
    sent: &BTreeSet<String>,
    fields: &[&str],
) -> Result<Option<T>, TestCaseError> {
    match query::<T>(uri) {
        Ok(params) => Ok(Some(params)),
        Err(error) => {
            let problem = error.problem();
            prop_assert_eq!(problem.status, 422, "{:?}", problem);
            prop_assert_eq!(&problem.code, "validation_failed");
            let field = problem.field.clone().unwrap_or_default();
            prop_assert!(
                sent.contains(&field) || fields.contains(&field.as_str()),
                "the error names {:?}, which is neither sent ({:?}) nor a parameter: {:?}",
                field,
                sent,
                problem
            );
            Ok(None)
        }
    }
}

#[test]
fn query_strings_are_read_as_sent_or_refused_with_a_422_naming_a_parameter() {
    let seeds = text_corpus("queries");
    fuzz(seeds, query_strings(), |query| {
        let uri: axum::http::Uri = format!("/list?{query}")
            .parse()
            .map_err(|e| TestCaseError::fail(format!("no request can carry {query:?}: {e}")))?;
        // What the client sent, decoded the way every form reader decodes it.
        let pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes()).into_owned().collect();
        let sent: BTreeSet<String> = pairs.iter().map(|(k, _)| k.clone()).collect();
        let only = |key: &str| {
            let mut values = pairs.iter().filter(|(k, _)| k == key).map(|(_, v)| v.clone());
            let first = values.next();
            assert!(values.next().is_none(), "{key} was sent twice and still accepted: {query:?}");
            first
        };
        let list = ["state", "gpu_class", "label", "limit", "cursor"];
        if let Some(p) = check_query::<JobListParams>(&uri, &sent, &list)? {
            prop_assert_eq!(p.state, only("state"));
            prop_assert_eq!(p.gpu_class, only("gpu_class"));
            prop_assert_eq!(p.label, only("label"));
            prop_assert_eq!(p.cursor, only("cursor"));
            prop_assert_eq!(p.limit, only("limit").map(|l| l.parse::<i64>().expect("an accepted limit is a number")));
        }
        if let Some(p) = check_query::<ExportParams>(&uri, &sent, &["period", "format"])? {
            prop_assert_eq!(Some(p.period), only("period"));
            prop_assert_eq!(Some(p.format.as_str().to_owned()), only("format"));
        }
        let usage = ["from", "to", "step", "group_by"];
        if let Some(p) = check_query::<UsageParams>(&uri, &sent, &usage)? {
            let time = |key| only(key).map(|t| t.parse::<DateTime<Utc>>().expect("an accepted time parses"));
            prop_assert_eq!(p.from, time("from"));
            prop_assert_eq!(p.to, time("to"));
            prop_assert_eq!(p.step, only("step"));
            prop_assert_eq!(p.group_by, only("group_by"));
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------
// JSON bodies: `http::extract::parse_json` with the real request types.
// ---------------------------------------------------------------------------------------------

/// A request type: its name, its parser, and every field name it has (nested ones too), which
/// an error may name as missing.
struct BodyType {
    name: &'static str,
    parse: fn(&[u8]) -> Result<(), ApiError>,
    fields: &'static [&'static str],
    shape: &'static [(&'static str, Kind)],
}

/// What a field holds, to generate plausible values for it.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Text,
    Int,
    Bool,
    Texts,
    TextMap,
    Topology,
}

const JOB_SPEC: BodyType = BodyType {
    name: "JobSpec",
    parse: |bytes| parse_json::<JobSpec>(bytes).map(drop),
    fields: &[
        "name",
        "gpu_class",
        "replicas",
        "gpus_per_replica",
        "priority_class",
        "max_runtime_seconds",
        "expected_runtime_seconds",
        "image",
        "command",
        "env",
        "labels",
        "topology",
        "preemption_grace_seconds",
        "max_retries",
        "allow_spot",
        "level",
        "mode",
    ],
    shape: &[
        ("name", Kind::Text),
        ("gpu_class", Kind::Text),
        ("replicas", Kind::Int),
        ("gpus_per_replica", Kind::Int),
        ("priority_class", Kind::Text),
        ("max_runtime_seconds", Kind::Int),
        ("expected_runtime_seconds", Kind::Int),
        ("image", Kind::Text),
        ("command", Kind::Texts),
        ("env", Kind::TextMap),
        ("labels", Kind::TextMap),
        ("topology", Kind::Topology),
        ("preemption_grace_seconds", Kind::Int),
        ("max_retries", Kind::Int),
        ("allow_spot", Kind::Bool),
    ],
};

const BODY_TYPES: [BodyType; 4] = [
    JOB_SPEC,
    BodyType {
        name: "NewTeam",
        parse: |bytes| parse_json::<NewTeam>(bytes).map(drop),
        fields: &["name", "parent", "display_name"],
        shape: &[("name", Kind::Text), ("parent", Kind::Text), ("display_name", Kind::Text)],
    },
    BodyType {
        name: "QuotaSpec",
        parse: |bytes| parse_json::<QuotaSpec>(bytes).map(drop),
        fields: &["reserved", "burst", "lendable"],
        shape: &[("reserved", Kind::Int), ("burst", Kind::Int), ("lendable", Kind::Int)],
    },
    BodyType {
        name: "NewPriorityClass",
        parse: |bytes| parse_json::<NewPriorityClass>(bytes).map(drop),
        fields: &["name", "priority", "preemptible", "usage_factor_milli", "price_multiplier_milli", "description"],
        shape: &[
            ("name", Kind::Text),
            ("priority", Kind::Int),
            ("preemptible", Kind::Bool),
            ("usage_factor_milli", Kind::Int),
            ("price_multiplier_milli", Kind::Int),
            ("description", Kind::Text),
        ],
    },
];

/// Text with the characters that matter to a JSON reader or to a path: NUL, quotes,
/// backslashes, backticks, dots, brackets, and any character at all.
fn json_text() -> impl Strategy<Value = String> {
    vec(
        prop_oneof![
            24 => select("abcxyz-_019 ".chars().collect::<Vec<_>>()),
            1 => Just('\0'),
            4 => select(vec!['"', '\\', '`', '.', '[', ']', '/', '\n', '\u{7f}', '\u{2028}', '\u{fffd}']),
            4 => any::<char>(),
        ],
        0..12,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

fn json_key() -> impl Strategy<Value = String> {
    let known: Vec<&str> = BODY_TYPES.iter().flat_map(|t| t.fields.iter().copied()).collect();
    prop_oneof![3 => select(known).prop_map(String::from), 2 => json_text()]
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-3_i64..3).prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        json_text().prop_map(Value::String),
    ]
}

/// Any JSON value: objects with known and unknown keys, arrays, every kind of leaf.
fn json_values() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(5, 48, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            vec((json_key(), inner), 0..6).prop_map(|entries| Value::Object(entries.into_iter().collect())),
        ]
    })
}

/// A value buried under more levels of arrays and objects than serde_json will read.
fn deep_values() -> impl Strategy<Value = Value> {
    (json_leaf(), vec(any::<bool>(), 130..300)).prop_map(|(mut value, levels)| {
        for object in levels {
            value = if object { json!({ "labels": value }) } else { json!([value]) };
        }
        value
    })
}

fn plausible(kind: Kind) -> BoxedStrategy<Value> {
    match kind {
        Kind::Text => json_text().prop_map(Value::String).boxed(),
        Kind::Int => prop_oneof![
            3 => (-2_i64..2000).prop_map(Value::from),
            1 => any::<i64>().prop_map(Value::from),
            1 => Just(json!(u64::MAX)),
            1 => Just(json!(1.5)),
        ]
        .boxed(),
        Kind::Bool => any::<bool>().prop_map(Value::Bool).boxed(),
        Kind::Texts => vec(json_text(), 0..4).prop_map(Value::from).boxed(),
        Kind::TextMap => btree_map(json_text(), json_text(), 0..4)
            .prop_map(|map| Value::Object(map.into_iter().map(|(k, v)| (k, Value::String(v))).collect()))
            .boxed(),
        Kind::Topology => (
            select(vec!["nvlink-domain", "node", "rack", "zone", "pod"]),
            select(vec!["required", "preferred", "must"]),
        )
            .prop_map(|(level, mode)| json!({ "level": level, "mode": mode }))
            .boxed(),
    }
}

/// An object shaped like `shape`: most fields present with a plausible value, some with any
/// value, some missing, sometimes one more key.
fn body_like(shape: &'static [(&'static str, Kind)]) -> impl Strategy<Value = Value> {
    let fields: Vec<BoxedStrategy<Option<(String, Value)>>> = shape
        .iter()
        .map(|&(name, kind)| {
            prop_oneof![
                1 => Just(None),
                12 => plausible(kind).prop_map(move |v| Some((name.to_owned(), v))),
                1 => json_values().prop_map(move |v| Some((name.to_owned(), v))),
            ]
            .boxed()
        })
        .collect();
    (fields, option::weighted(0.15, (json_key(), json_values())))
        .prop_map(|(fields, extra)| Value::Object(fields.into_iter().flatten().chain(extra).collect()))
}

/// Any value, a value too deep to read, or an object shaped like one of the request types.
fn bodies() -> impl Strategy<Value = Value> {
    let shaped: Vec<_> = BODY_TYPES.iter().map(|t| body_like(t.shape).boxed()).collect();
    prop_oneof![3 => json_values(), 1 => deep_values(), 6 => Union::new(shaped)]
}

/// Every path serde_path_to_error can name in `value`, written as it writes them
/// (`env.LR`, `command[2]`; a key below an empty one is `.LR`). `at` is `None` at the top. A
/// key holding a NUL is also written as the NUL check names it.
fn paths_in(value: &Value, at: Option<&str>, out: &mut BTreeSet<String>) {
    let child = |key: &str| at.map_or_else(|| key.to_owned(), |at| format!("{at}.{key}"));
    match value {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let path = format!("{}[{i}]", at.unwrap_or(""));
                paths_in(item, Some(&path), out);
                out.insert(path);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                if key.contains('\0') {
                    out.insert(child(&key.replace('\0', "\\u0000")));
                }
                let path = child(key);
                paths_in(item, Some(&path), out);
                out.insert(path);
            }
        }
        _ => {}
    }
}

/// The paths of the strings and keys of `value` that hold a NUL, written as above; a string
/// at the top (or under an empty key there) is the `body`.
fn nul_paths(value: &Value, at: Option<&str>, out: &mut BTreeSet<String>) {
    let child = |key: &str| at.map_or_else(|| key.to_owned(), |at| format!("{at}.{key}"));
    match value {
        Value::String(s) if s.contains('\0') => {
            out.insert(at.filter(|at| !at.is_empty()).unwrap_or("body").to_owned());
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                nul_paths(item, Some(&format!("{}[{i}]", at.unwrap_or(""))), out);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                if key.contains('\0') {
                    out.insert(child(&key.replace('\0', "\\u0000")));
                }
                nul_paths(item, Some(&child(key)), out);
            }
        }
        _ => {}
    }
}

/// Levels of arrays and objects in `value`.
fn depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// Whether `field` is a path of the input, the body itself, or a field of the type that a
/// path of the input (or the top level) lacks.
fn names_the_input(field: &str, paths: &BTreeSet<String>, fields: &[&str]) -> bool {
    field == "body"
        || paths.contains(field)
        || fields.contains(&field)
        || field.match_indices('.').any(|(at, _)| paths.contains(&field[..at]) && fields.contains(&&field[at + 1..]))
}

/// Checks one body against one type: never a panic, never a 5xx; a field an error names is
/// in the input (when the input is JSON); a NUL anywhere is never accepted.
fn check_body(bytes: &[u8], value: Option<&Value>, body_type: &BodyType) -> Result<bool, TestCaseError> {
    let name = body_type.name;
    let parsed = (body_type.parse)(bytes);
    let mut nuls = BTreeSet::new();
    if let Some(value) = value {
        nul_paths(value, None, &mut nuls);
    }
    match parsed {
        Ok(()) => {
            let value = value.ok_or_else(|| TestCaseError::fail(format!("{name} accepted a body that is not JSON")))?;
            prop_assert!(nuls.is_empty(), "{} accepted NUL characters at {:?}", name, nuls);
            prop_assert!(value.is_object(), "{} accepted a body that is not an object: {}", name, value);
            Ok(true)
        }
        Err(error) => {
            let problem = error.problem();
            prop_assert!((400..500).contains(&problem.status), "{}: {:?}", name, problem);
            let codes = ["validation_failed", "malformed_body"];
            prop_assert!(codes.contains(&problem.code.as_str()), "{}: {:?}", name, problem);
            if let Some(value) = value {
                let mut paths = BTreeSet::new();
                paths_in(value, None, &mut paths);
                if let Some(field) = &problem.field {
                    prop_assert!(
                        names_the_input(field, &paths, body_type.fields),
                        "{} names {:?}, which the body does not hold: {:?}",
                        name,
                        field,
                        problem
                    );
                }
                // Deeper than serde_json reads, a body is refused for its depth first.
                if !nuls.is_empty() && depth(value) <= 100 {
                    let first = problem.errors.first().map(|e| (e.code.as_str(), e.field.as_str()));
                    prop_assert!(
                        matches!(first, Some(("control_character", f)) if nuls.contains(f)),
                        "{} must name where the NUL is ({:?}): {:?}",
                        name,
                        nuls,
                        problem
                    );
                }
            }
            Ok(false)
        }
    }
}

/// Small changes to a JSON text: a byte flipped, a token that matters put in, a piece cut out.
#[derive(Debug, Clone)]
enum ByteMutation {
    Flip(usize, u8),
    Insert(usize, &'static str),
    Delete(usize, usize),
    Truncate(usize),
}

fn byte_mutations() -> impl Strategy<Value = ByteMutation> {
    let token = select(vec![
        "\\u0000",
        "\\\\u0000",
        "\"",
        "\\",
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "1e400",
        "-",
        "99999999999999999999999",
        "\\ud800",
        "\u{0}",
        "\u{ff}",
        "null",
        "[[[[[[[[",
        "{\"a`b\":1,",
        " ",
        "\u{feff}",
    ]);
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, b)| ByteMutation::Flip(at, b)),
        (any::<usize>(), token).prop_map(|(at, t)| ByteMutation::Insert(at, t)),
        (any::<usize>(), 1_usize..8).prop_map(|(at, n)| ByteMutation::Delete(at, n)),
        any::<usize>().prop_map(ByteMutation::Truncate),
    ]
}

fn mutate_bytes(mut bytes: Vec<u8>, mutations: &[ByteMutation]) -> Vec<u8> {
    for m in mutations {
        let len = bytes.len();
        match *m {
            ByteMutation::Flip(at, b) if len > 0 => bytes[at % len] ^= b,
            ByteMutation::Insert(at, token) => {
                let at = at % (len + 1);
                bytes.splice(at..at, token.bytes());
            }
            ByteMutation::Delete(at, n) if len > 0 => {
                let at = at % len;
                bytes.drain(at..(at + n).min(len));
            }
            ByteMutation::Truncate(at) => bytes.truncate(at % (len + 1)),
            _ => {}
        }
    }
    bytes
}

#[test]
fn any_bytes_as_a_json_body_are_refused_with_a_4xx_or_accepted_as_an_object_without_nul() {
    let seeds = corpus("json");
    let bases: Vec<Vec<u8>> = seeds.iter().map(|(_, bytes)| bytes.clone()).collect();
    let strategy = prop_oneof![
        1 => vec(any::<u8>(), 0..64),
        3 => (select(bases), vec(byte_mutations(), 1..4)).prop_map(|(base, m)| mutate_bytes(base, &m)),
    ];
    fuzz(seeds, strategy, |bytes| {
        let value: Option<Value> = serde_json::from_slice(&bytes).ok();
        for body_type in &BODY_TYPES {
            check_body(&bytes, value.as_ref(), body_type)?;
        }
        Ok(())
    });
}

#[test]
fn json_bodies_of_any_shape_are_refused_with_a_4xx_naming_a_field_of_the_body_and_nul_is_never_accepted() {
    let seeds: Vec<(String, Value)> = corpus("json")
        .into_iter()
        .filter_map(|(name, bytes)| Some((name, serde_json::from_slice(&bytes).ok()?)))
        .collect();
    fuzz(seeds, bodies(), |value| {
        let bytes = serde_json::to_vec(&value).expect("a value serializes");
        for body_type in &BODY_TYPES {
            check_body(&bytes, Some(&value), body_type)?;
        }
        Ok(())
    });
}

/// Puts a NUL into the `choice`-th string or key of `value` (counted depth first), at the
/// `at`-th character.
fn insert_nul(value: &mut Value, choice: usize, at: usize) {
    fn count(value: &Value) -> usize {
        match value {
            Value::String(_) => 1,
            Value::Array(items) => items.iter().map(count).sum(),
            Value::Object(map) => map.iter().map(|(_, v)| 1 + count(v)).sum(),
            _ => 0,
        }
    }
    fn with_nul(s: &str, at: usize) -> String {
        let at = s.char_indices().map(|(i, _)| i).chain([s.len()]).nth(at % (s.chars().count() + 1)).unwrap_or(0);
        format!("{}\0{}", &s[..at], &s[at..])
    }
    fn visit(value: &mut Value, n: &mut usize, at: usize) -> bool {
        match value {
            Value::String(s) => {
                if *n == 0 {
                    *s = with_nul(s, at);
                    return true;
                }
                *n -= 1;
                false
            }
            Value::Array(items) => items.iter_mut().any(|v| visit(v, n, at)),
            Value::Object(map) => {
                let keys: Vec<String> = map.keys().cloned().collect();
                for key in keys {
                    if *n == 0 {
                        let item = map.remove(&key).expect("the key is there");
                        map.insert(with_nul(&key, at), item);
                        return true;
                    }
                    *n -= 1;
                    if visit(map.get_mut(&key).expect("the key is there"), n, at) {
                        return true;
                    }
                }
                false
            }
            _ => false,
        }
    }
    let total = count(value);
    if total == 0 {
        *value = json!({ "\0": value.take() });
        return;
    }
    let mut n = choice % total;
    visit(value, &mut n, at);
}

#[test]
fn a_nul_in_any_string_or_key_of_a_request_body_is_refused_with_its_path_named() {
    let shaped: Vec<_> = BODY_TYPES.iter().map(|t| body_like(t.shape).boxed()).collect();
    let strategy = (Union::new(shaped), any::<usize>(), any::<usize>()).prop_map(|(mut v, choice, at)| {
        insert_nul(&mut v, choice, at);
        v
    });
    let seeds: Vec<(String, Value)> = corpus("json")
        .into_iter()
        .filter_map(|(name, bytes)| Some((name, serde_json::from_slice(&bytes).ok()?)))
        .filter(|(_, value): &(String, Value)| {
            let mut nuls = BTreeSet::new();
            nul_paths(value, None, &mut nuls);
            !nuls.is_empty()
        })
        .collect();
    assert!(!seeds.is_empty(), "the json corpus holds bodies with NUL characters");
    fuzz(seeds, strategy, |value| {
        let bytes = serde_json::to_vec(&value).expect("a value serializes");
        for body_type in &BODY_TYPES {
            prop_assert!(!check_body(&bytes, Some(&value), body_type)?, "{} accepted a NUL", body_type.name);
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------
// Job specs: the checks of `domain::job` that need no catalogue.
// ---------------------------------------------------------------------------------------------

fn env_names() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => select(vec![
            "LR", "_X", "PATH", "FAIRWAY_SIM_RUNTIME_SECONDS", "FAIRWAY_SIM_", "FAIRWAY_JOB_ID", "FAIRWAY_", "FAIRWAY",
            "NVIDIA_VISIBLE_DEVICES", "NVIDIA_", "NVIDIA", "nvidia_x", "1A", "A-B", "", "É",
        ])
        .prop_map(String::from),
        3 => vec(select("AZaz09_".chars().collect::<Vec<_>>()), 1..10).prop_map(|c| c.into_iter().collect()),
        1 => vec(select("AZaz09_".chars().collect::<Vec<_>>()), 120..135).prop_map(|c| c.into_iter().collect()),
    ]
}

fn label_segments() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => vec(select("azAZ09-_.".chars().collect::<Vec<_>>()), 0..10).prop_map(|c| c.into_iter().collect()),
        1 => vec(select("az09-".chars().collect::<Vec<_>>()), 60..66).prop_map(|c| c.into_iter().collect()),
        1 => json_text(),
    ]
}

fn label_keys() -> impl Strategy<Value = String> {
    let prefix = prop_oneof![
        4 => Just(String::new()),
        2 => vec(label_segments(), 1..4).prop_map(|parts| format!("{}/", parts.join("."))),
        1 => select(vec!["/", "//", "example.com/", "a..b/", "-a/", "fairway.dev/"]).prop_map(String::from),
    ];
    (prefix, label_segments()).prop_map(|(prefix, name)| prefix + &name)
}

/// Text of `chars`, `len` long.
fn text_of(chars: &'static str, len: std::ops::Range<usize>) -> impl Strategy<Value = String> {
    vec(select(chars.chars().collect::<Vec<_>>()), len).prop_map(|chars| chars.into_iter().collect())
}

/// A label segment that keeps the rules: alphanumeric at both ends.
fn clean_segment() -> impl Strategy<Value = String> {
    (text_of("az09AZ", 1..2), text_of("az09-_.", 0..8), text_of("az09", 1..2)).prop_map(|(a, b, c)| a + &b + &c)
}

/// Job specs whose every field keeps the rules about two times in three and breaks them
/// otherwise, so that each rule is seen both ways.
fn job_specs() -> impl Strategy<Value = Value> {
    let hostile = || {
        prop_oneof![
            4 => json_text().prop_map(|t| t.replace('\0', "")),
            1 => vec(any::<char>(), 190..210).prop_map(|c| c.into_iter().collect::<String>()),
        ]
    };
    let name = prop_oneof![3 => text_of("abc XYZ019-_<>é'\"", 1..30), 1 => hostile()];
    let image = prop_oneof![3 => text_of("abcz019./:-@_", 1..40), 1 => hostile()];
    let arg = || prop_oneof![3 => text_of("abc XYZ019-_=./", 0..12), 1 => hostile()];
    let env_name =
        prop_oneof![2 => (text_of("AZ_", 1..2), text_of("AZ09_", 0..10)).prop_map(|(a, b)| a + &b), 1 => env_names()];
    let label_key = prop_oneof![
        3 => (option::of(vec(clean_segment(), 1..3)), clean_segment())
            .prop_map(|(prefix, name)| prefix.map_or(name.clone(), |p| format!("{}/{name}", p.join(".")))),
        1 => label_keys(),
    ];
    let label_value = prop_oneof![3 => clean_segment(), 1 => Just(String::new()), 1 => label_segments()];
    let count = || prop_oneof![4 => 0_i64..80, 1 => -2_i64..1100, 1 => any::<i64>()];
    (
        (name, image, vec(arg(), 0..4), btree_map(env_name, arg(), 0..4), btree_map(label_key, label_value, 0..4)),
        (count(), count(), option::of(count()), option::of(count()), option::of(count()), option::of(count())),
    )
        .prop_map(|((name, image, command, env, labels), (replicas, gpus, runtime, grace, retries, expected))| {
            json!({
                "name": name,
                "gpu_class": "h100-80gb",
                "image": image,
                "command": command,
                "env": env,
                "labels": labels,
                "replicas": replicas,
                "gpus_per_replica": gpus,
                "max_runtime_seconds": runtime,
                "expected_runtime_seconds": expected,
                "preemption_grace_seconds": grace,
                "max_retries": retries,
            })
        })
}

/// A Kubernetes-style name segment: 1 to 63 letters, digits, `-`, `_`, `.`, alphanumeric at
/// both ends (written here apart from `domain::job`).
fn label_segment_ok(s: &str) -> bool {
    let alnum_ends = s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && s.chars().last().is_some_and(|c| c.is_ascii_alphanumeric());
    alnum_ends && s.len() <= 63 && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// What each job spec rule means, as the API documents it; `None` when it holds.
fn expected_refusals(spec: &JobSpec) -> BTreeMap<&'static str, Vec<String>> {
    let mut bad: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    let name = &spec.name;
    if name.chars().all(char::is_whitespace) || name.chars().count() > 200 || name.chars().any(char::is_control) {
        bad.entry("name").or_default().push("name".into());
    }
    let image = &spec.image;
    if image.is_empty() || image.len() > 512 || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        bad.entry("image").or_default().push("image".into());
    }
    if spec.env.len() > 256 {
        bad.entry("env").or_default().push("env".into());
    }
    if spec.labels.len() > 64 {
        bad.entry("labels").or_default().push("labels".into());
    }
    if spec.command.len() > 256 {
        bad.entry("command").or_default().push("command".into());
    }
    for (i, arg) in spec.command.iter().enumerate() {
        if arg.len() > 4096 || arg.contains('\0') {
            bad.entry("command").or_default().push(format!("command[{i}]"));
        }
    }
    for (key, value) in &spec.env {
        let posix = key.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && key.len() <= 128;
        let platform = (key.starts_with("FAIRWAY_") && !key.starts_with("FAIRWAY_SIM_")) || key.starts_with("NVIDIA_");
        if !posix || platform || value.len() > 32 * 1024 || value.contains('\0') {
            bad.entry("env").or_default().push(format!("env.{key}"));
        }
    }
    for (key, value) in &spec.labels {
        let key_ok = match key.rsplit_once('/') {
            None => label_segment_ok(key),
            Some((prefix, name)) => {
                prefix.len() <= 253
                    && prefix.split('.').all(|part| {
                        !part.is_empty()
                            && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                            && !part.starts_with('-')
                            && !part.ends_with('-')
                    })
                    && label_segment_ok(name)
            }
        };
        if !key_ok || !(value.is_empty() || label_segment_ok(value)) {
            bad.entry("labels").or_default().push(format!("labels.{key}"));
        }
    }
    for (field, value, min, max) in [
        ("replicas", Some(spec.replicas), 1, 1024),
        ("gpus_per_replica", Some(spec.gpus_per_replica), 1, 64),
        ("preemption_grace_seconds", spec.preemption_grace_seconds, 0, 86_400),
        ("max_retries", spec.max_retries, 0, 100),
    ] {
        if value.is_some_and(|v| !(min..=max).contains(&v)) {
            bad.entry(field).or_default().push(field.into());
        }
    }
    // Against the maximum runtime it names; the catalogue's default when it names none is
    // not this test's business.
    if let (Some(expected), Some(max)) = (spec.expected_runtime_seconds, spec.max_runtime_seconds) {
        if !(1..=max).contains(&expected) {
            bad.entry("expected_runtime_seconds").or_default().push("expected_runtime_seconds".into());
        }
    }
    bad
}

#[test]
fn job_specs_that_parse_are_accepted_or_refused_by_each_rule_with_the_offending_field_named() {
    let seeds: Vec<(String, Value)> = corpus("job_specs")
        .into_iter()
        .map(|(name, bytes)| {
            let value = serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("job_specs/{name}: {e}"));
            (name, value)
        })
        .collect();
    fuzz(seeds, job_specs(), |value: Value| {
        let bytes = serde_json::to_vec(&value).expect("a value serializes");
        // Refusals of the body itself are the JSON properties' business.
        let Ok(spec) = parse_json::<JobSpec>(&bytes) else { return Ok(()) };
        let checks: [(&str, Result<(), FieldError>); 10] = [
            ("name", check_name("name", &spec.name)),
            ("image", check_image("image", &spec.image)),
            ("command", check_command("command", &spec.command)),
            ("env", check_env("env", &spec.env)),
            ("labels", check_labels("labels", &spec.labels)),
            ("replicas", check_range("replicas", spec.replicas, 1, 1024)),
            ("gpus_per_replica", check_range("gpus_per_replica", spec.gpus_per_replica, 1, 64)),
            (
                "preemption_grace_seconds",
                spec.preemption_grace_seconds.map_or(Ok(()), |g| check_grace("preemption_grace_seconds", g)),
            ),
            ("max_retries", spec.max_retries.map_or(Ok(()), |r| check_range("max_retries", r, 0, 100))),
            (
                "expected_runtime_seconds",
                match (spec.expected_runtime_seconds, spec.max_runtime_seconds) {
                    (Some(e), Some(max)) => check_expected_runtime("expected_runtime_seconds", e, max),
                    _ => Ok(()),
                },
            ),
        ];
        let expected = expected_refusals(&spec);
        for (rule, result) in checks {
            match (result, expected.get(rule)) {
                (Ok(()), None) => {}
                (Ok(()), Some(offending)) => {
                    return Err(TestCaseError::fail(format!("{rule} accepted although {offending:?} break the rule")));
                }
                (Err(e), None) => return Err(TestCaseError::fail(format!("{rule} refused a valid value: {e:?}"))),
                (Err(e), Some(offending)) => {
                    prop_assert!(
                        offending.contains(&e.field),
                        "{} names {:?}, not one of {:?}",
                        rule,
                        e.field,
                        offending
                    );
                    prop_assert!(!e.code.is_empty() && !e.message.is_empty(), "{:?}", e);
                }
            }
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------
// TOML: the clusters file and the simulated inventory.
// ---------------------------------------------------------------------------------------------

/// Changes to a TOML text: its lines deleted, repeated or swapped, a byte flipped, a token put
/// in, the end cut off.
#[derive(Debug, Clone)]
enum TextMutation {
    DeleteLine(usize),
    DuplicateLine(usize),
    SwapLines(usize, usize),
    Bytes(ByteMutation),
}

fn toml_tokens() -> Vec<&'static str> {
    vec![
        "[",
        "]",
        "[[",
        "]]",
        "=",
        "\"",
        "'",
        "\n",
        "#",
        ".",
        ",",
        "{",
        "}",
        "[[cluster]]\n",
        "[[cluster.pool]]\n",
        "[[node]]\n",
        "[[class]]\n",
        "[[pool]]\n",
        "name",
        "kind",
        "\"sim\"",
        "\"kubernetes\"",
        "gpus",
        "speedup",
        "0",
        "1",
        "-1",
        "1e400",
        "nan",
        "-inf",
        "4294967296",
        "true",
        "\"\\u0000\"",
        " ",
        "\u{0}",
        "é",
    ]
}

fn text_mutations() -> impl Strategy<Value = TextMutation> {
    let insert = (any::<usize>(), select(toml_tokens())).prop_map(|(at, t)| ByteMutation::Insert(at, t));
    prop_oneof![
        2 => any::<usize>().prop_map(TextMutation::DeleteLine),
        2 => any::<usize>().prop_map(TextMutation::DuplicateLine),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| TextMutation::SwapLines(a, b)),
        2 => insert.prop_map(TextMutation::Bytes),
        2 => byte_mutations().prop_map(TextMutation::Bytes),
    ]
}

fn mutate_text(text: &str, mutations: &[TextMutation]) -> String {
    let mut text = text.to_owned();
    for m in mutations {
        let mut lines: Vec<String> = text.split_inclusive('\n').map(str::to_owned).collect();
        let n = lines.len().max(1);
        match m {
            TextMutation::DeleteLine(i) if !lines.is_empty() => drop(lines.remove(i % n)),
            TextMutation::DuplicateLine(i) if !lines.is_empty() => {
                let line = lines[i % n].clone();
                lines.insert(i % n, line);
            }
            TextMutation::SwapLines(a, b) if !lines.is_empty() => lines.swap(a % n, b % n),
            TextMutation::Bytes(b) => {
                let bytes = mutate_bytes(text.into_bytes(), std::slice::from_ref(b));
                lines = vec![String::from_utf8_lossy(&bytes).into_owned()];
            }
            _ => {}
        }
        text = lines.concat();
    }
    text
}

/// A seed changed a little, or text made of TOML's tokens.
fn toml_texts(seeds: Vec<String>) -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (select(seeds), vec(text_mutations(), 1..3)).prop_map(|(seed, m)| mutate_text(&seed, &m)),
        1 => vec(prop_oneof![4 => select(toml_tokens()).prop_map(String::from), 1 => any::<char>().prop_map(String::from)], 0..40)
            .prop_map(|tokens| tokens.concat()),
    ]
}

#[test]
fn a_clusters_file_is_read_into_usable_clusters_or_refused_with_a_message_that_says_where() {
    let seeds = text_corpus("clusters");
    let bases = seeds.iter().map(|(_, text)| text.clone()).collect();
    fuzz(seeds, toml_texts(bases), |text| {
        match clusters::parse(&text) {
            Ok(clusters) => {
                prop_assert!(!clusters.is_empty());
                let names: BTreeSet<&str> = clusters.iter().map(ClusterConfig::name).collect();
                prop_assert_eq!(names.len(), clusters.len(), "cluster names are unique");
                for cluster in &clusters {
                    prop_assert!(ClusterName::parse("name", cluster.name()).is_ok(), "{:?}", cluster.name());
                    if let ClusterConfig::Sim(sim) = cluster {
                        // Every simulated duration is divided by it.
                        let speedup = sim.speedup.unwrap_or(1.0);
                        prop_assert!(
                            speedup.is_finite() && speedup > 0.0,
                            "sim cluster {} accepted speedup {}",
                            sim.name,
                            speedup
                        );
                    }
                }
            }
            Err(error) => {
                let message = error.to_string();
                let detail = message.strip_prefix("clusters file: ").unwrap_or("");
                prop_assert!(!detail.is_empty(), "{:?}", message);
                let says_where = detail.contains(" line ") || detail.contains("in `") || detail.contains("cluster");
                prop_assert!(says_where, "the message does not say where: {}", message);
            }
        }
        Ok(())
    });
}

/// The keys of a simulated inventory's top level.
const INVENTORY_KEYS: [&str; 7] =
    ["cluster", "speedup", "default_runtime_seconds", "start_delay_ms", "class", "node", "pool"];

#[test]
fn a_sim_inventory_is_read_into_a_usable_cluster_or_refused_naming_the_key_or_line() {
    let seeds = text_corpus("inventory");
    let bases = seeds.iter().map(|(_, text)| text.clone()).collect();
    fuzz(seeds, toml_texts(bases), |text| {
        match SimConfig::from_toml(&text) {
            Ok(config) => {
                prop_assert!(config.speedup.is_finite() && config.speedup > 0.0);
                prop_assert!(config.default_runtime_seconds.is_finite() && config.default_runtime_seconds >= 0.0);
                prop_assert!(!config.cluster.trim().is_empty());
                let classes: BTreeSet<&str> = config.classes().iter().map(|c| c.name.as_str()).collect();
                for node in config.inventory() {
                    prop_assert!((1..=64).contains(&node.gpus), "{:?}", node);
                    prop_assert!(classes.contains(node.gpu_class.as_str()), "{:?}", node);
                    let domain = node.nvlink_domain_size;
                    prop_assert!(domain == 0 || node.gpus % domain == 0, "{:?}", node);
                }
            }
            Err(error) => {
                let (key, message) = match &error {
                    SimConfigError::Invalid { key, message } => (key, message),
                    other => return Err(TestCaseError::fail(format!("parsing text read a file: {other}"))),
                };
                prop_assert_eq!(error.to_string(), format!("{key}: {message}"));
                prop_assert!(!message.is_empty());
                let lines = text.lines().count() + 1;
                let first = key.split(['.', '[']).next().unwrap_or("");
                let says_where = match key.strip_prefix("line ") {
                    Some(n) => n.parse::<usize>().is_ok_and(|n| (1..=lines).contains(&n)),
                    None => key == "configuration" || INVENTORY_KEYS.contains(&first) || text.contains(first),
                };
                prop_assert!(says_where && !first.is_empty(), "the error does not say where: {}", error);
            }
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------
// Billing exports: CSV, JSON lines and FOCUS.
// ---------------------------------------------------------------------------------------------

/// The text users control in a ledger row.
#[derive(Debug, Clone, serde::Deserialize)]
struct UserText {
    job_name: Option<String>,
    team_name: String,
    reason: Option<String>,
    labels: Value,
}

/// Text with what breaks a CSV line (commas, quotes, line breaks) and what a spreadsheet
/// reads as a formula (a leading `=`, `+`, `-`, `@`, tab or carriage return).
fn user_text() -> impl Strategy<Value = String> {
    vec(
        prop_oneof![
            4 => select("abcXYZ019 ".chars().collect::<Vec<_>>()),
            3 => select(vec![',', '"', '\r', '\n', '\'', '=', '+', '-', '@', '\t', ';', '{', '}']),
            1 => any::<char>(),
        ],
        0..16,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

fn user_texts() -> impl Strategy<Value = UserText> {
    let label_value = prop_oneof![4 => user_text().prop_map(Value::String), 1 => json_values()];
    let labels = prop_oneof![
        9 => btree_map(user_text(), label_value, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
        1 => json_values(),
    ];
    (option::of(user_text()), user_text(), option::of(user_text()), labels.prop_map(without_floats))
        .prop_map(|(job_name, team_name, reason, labels)| UserText { job_name, team_name, reason, labels })
}

/// `value` with its floating-point numbers written as strings: serde_json (without its
/// `float_roundtrip` feature) reads a float back only to within a rounding step, and labels
/// hold text anyway.
fn without_floats(value: Value) -> Value {
    match value {
        Value::Number(n) if n.is_f64() => Value::String(n.to_string()),
        Value::Array(items) => Value::Array(items.into_iter().map(without_floats).collect()),
        Value::Object(map) => Value::Object(map.into_iter().map(|(k, v)| (k, without_floats(v))).collect()),
        other => other,
    }
}

/// The numbers of a row, within what the ledger's constraints allow.
#[derive(Debug, Clone)]
struct Amounts {
    kind: usize,
    gpus: i32,
    fraction_milli: i32,
    borrowing: bool,
    hour: u32,
    start_ms: i64,
    duration_ms: i64,
    rate: i64,
    multiplier: i32,
    list_cost: i64,
    billed_cost: i64,
    late: bool,
}

fn amounts() -> impl Strategy<Value = Amounts> {
    (
        (0_usize..3, prop_oneof![3 => 1_i32..=64, 1 => 1..=i32::MAX], 1_i32..=1000, any::<bool>()),
        (0_u32..24 * 28, 0_i64..3_599_999, 1_i64..=3_600_000, 0_i64..=100_000_000),
        (
            0_i32..=100_000,
            -1_000_000_000_000_i64..1_000_000_000_000,
            -1_000_000_000_000_i64..1_000_000_000_000,
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                (kind, gpus, fraction_milli, borrowing),
                (hour, start_ms, duration_ms, rate),
                (multiplier, list_cost, billed_cost, late),
            )| {
                Amounts {
                    kind,
                    gpus,
                    fraction_milli,
                    borrowing,
                    hour,
                    start_ms,
                    // A piece stays within its UTC hour.
                    duration_ms: duration_ms.min(3_600_000 - start_ms),
                    rate,
                    multiplier,
                    list_cost,
                    billed_cost,
                    late,
                }
            },
        )
}

const PERIOD: (i32, u32) = (2026, 11);

fn period() -> NaiveDate {
    NaiveDate::from_ymd_opt(PERIOD.0, PERIOD.1, 1).expect("a date")
}

/// A ledger row as the database could hold it, with `text` for what users wrote.
fn ledger_row(id: i64, text: UserText, a: &Amounts) -> ExportRow {
    let kind = ["usage", "correction", "reservation"][a.kind];
    // Late usage is booked into the next open period with its own charge time.
    let month_start = Utc.with_ymd_and_hms(PERIOD.0, PERIOD.1, 1, 0, 0, 0).single().expect("a time");
    let base = if a.late { month_start - Duration::days(3) } else { month_start };
    let charge_start = base + Duration::hours(i64::from(a.hour)) + Duration::milliseconds(a.start_ms);
    let reservation = kind == "reservation";
    let sign = if kind == "correction" { -1 } else { 1 };
    ExportRow {
        id,
        kind: kind.into(),
        corrects: (kind == "correction").then_some(id - 1),
        reason: text.reason,
        job_id: (!reservation).then(|| JobId::from_u128(u128::try_from(id).unwrap_or(0))),
        attempt: (!reservation).then_some(1),
        job_name: if reservation { None } else { Some(text.job_name.unwrap_or_default()) },
        team_id: TeamId::from_u128(7),
        team_name: text.team_name,
        gpu_class: if a.fraction_milli == 1000 { "h100-80gb".into() } else { "a100-80gb.mig-3g.40gb".into() },
        priority_class: "production".into(),
        gpus: a.gpus,
        fraction_milli: a.fraction_milli,
        borrowing: a.borrowing,
        charge_start,
        charge_end: charge_start + Duration::milliseconds(a.duration_ms),
        duration_ms: a.duration_ms,
        gpu_milli_ms: sign * i64::from(a.gpus) * i64::from(a.fraction_milli) * a.duration_ms,
        rate_micros_per_gpu_hour: a.rate,
        price_multiplier_milli: a.multiplier,
        list_cost_micros: a.list_cost,
        billed_cost_micros: a.billed_cost,
        currency: "USD".into(),
        billing_period: period(),
        labels: text.labels,
    }
}

/// Splits RFC 4180 text into records of fields, refusing what the RFC does not allow (a quote
/// in an unquoted field, anything but a comma or CRLF after a field, a bare line feed).
fn parse_csv(text: &str) -> Result<Vec<Vec<String>>, String> {
    let mut records = Vec::new();
    let mut chars = text.chars().peekable();
    while chars.peek().is_some() {
        let mut record = Vec::new();
        loop {
            let mut field = String::new();
            if chars.peek() == Some(&'"') {
                chars.next();
                loop {
                    match chars.next() {
                        None => return Err(format!("record {}: a quoted field is never closed", records.len())),
                        Some('"') if chars.peek() == Some(&'"') => {
                            chars.next();
                            field.push('"');
                        }
                        Some('"') => break,
                        Some(c) => field.push(c),
                    }
                }
            } else {
                while let Some(&c) = chars.peek() {
                    if c == ',' || c == '\r' {
                        break;
                    }
                    if c == '"' || c == '\n' {
                        return Err(format!("record {}: {c:?} in an unquoted field", records.len()));
                    }
                    field.push(c);
                    chars.next();
                }
            }
            record.push(field);
            match (chars.next(), chars.peek()) {
                (Some(','), _) => {}
                (Some('\r'), Some('\n')) => {
                    chars.next();
                    break;
                }
                (other, _) => return Err(format!("record {}: a field ends in {other:?}", records.len())),
            }
        }
        records.push(record);
    }
    Ok(records)
}

/// A cell of user text as its reader takes it back: without the one apostrophe the writer
/// puts in front of text a spreadsheet would read as a formula (OWASP's advice).
fn unguarded(cell: &str) -> &str {
    cell.strip_prefix('\'').unwrap_or(cell)
}

/// Whether a spreadsheet may evaluate the cell: it starts as a formula does and is not a
/// plain number such as a negative cost.
fn is_formula(cell: &str) -> bool {
    let number = cell.strip_prefix('-').is_some_and(|n| {
        let (whole, fraction) = n.split_once('.').unwrap_or((n, "0"));
        !whole.is_empty() && whole.chars().chain(fraction.chars()).all(|c| c.is_ascii_digit())
    });
    cell.starts_with(['=', '+', '-', '@', '\t', '\r']) && !number
}

fn export(format: Format, rows: &[ExportRow]) -> (Vec<u8>, fairway::billing::export::Control) {
    let mut exporter = Exporter::new(format, period(), "EUR");
    let mut bytes = exporter.header();
    // Written in two pages, as `export::write` does for a period of many rows.
    let (first, second) = rows.split_at(rows.len() / 2);
    bytes.extend(exporter.rows(first));
    bytes.extend(exporter.rows(second));
    (bytes, exporter.control())
}

fn export_rows() -> impl Strategy<Value = Vec<ExportRow>> {
    vec((user_texts(), amounts()), 0..6).prop_map(|rows| {
        rows.into_iter().zip(1..).map(|((text, amounts), id)| ledger_row(id, text, &amounts)).collect()
    })
}

fn export_seeds() -> Vec<(String, Vec<ExportRow>)> {
    let usage = Amounts {
        kind: 0,
        gpus: 2,
        fraction_milli: 428,
        borrowing: false,
        hour: 10,
        start_ms: 0,
        duration_ms: 1_800_000,
        rate: 1_000_000,
        multiplier: 1000,
        list_cost: 1_000_000,
        billed_cost: 1_000_000,
        late: false,
    };
    corpus("exports")
        .into_iter()
        .map(|(name, bytes)| {
            let text: UserText = serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("exports/{name}: {e}"));
            let reservation = Amounts { kind: 2, ..usage.clone() };
            let correction = Amounts { kind: 1, list_cost: -1, billed_cost: -1, late: true, ..usage.clone() };
            let rows = vec![
                ledger_row(1, text.clone(), &usage),
                ledger_row(2, text.clone(), &correction),
                ledger_row(3, text, &reservation),
            ];
            (name, rows)
        })
        .collect()
}

/// The cell of `column` in a record under `header`.
fn cell_of<'a>(header: &[String], record: &'a [String], column: &str) -> &'a str {
    let at = header.iter().position(|c| c == column).unwrap_or_else(|| panic!("no column {column}"));
    &record[at]
}

#[test]
fn every_csv_and_focus_line_parses_back_into_the_header_columns_with_user_text_intact_and_no_formula() {
    fuzz(export_seeds(), export_rows(), |rows| {
        for format in [Format::Csv, Format::Focus] {
            let (bytes, _) = export(format, &rows);
            let text = String::from_utf8(bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let records = parse_csv(&text).map_err(|e| TestCaseError::fail(format!("{format:?}: {e}\n{text}")))?;
            prop_assert_eq!(records.len(), rows.len() + 1, "{:?}: a header and one record per row", format);
            let header = &records[0];
            if format == Format::Focus {
                prop_assert_eq!(header, &FOCUS_COLUMNS.map(String::from).to_vec());
            }
            for (row, record) in rows.iter().zip(&records[1..]) {
                prop_assert_eq!(record.len(), header.len(), "{:?}: {:?}", format, record);
                for value in record {
                    prop_assert!(!is_formula(value), "{:?}: a spreadsheet would evaluate {:?}", format, value);
                }
                let cell = |column| cell_of(header, record, column);
                if format == Format::Csv {
                    prop_assert_eq!(unguarded(cell("team")), row.team_name.as_str());
                    prop_assert_eq!(unguarded(cell("job_name")), row.job_name.as_deref().unwrap_or(""));
                    prop_assert_eq!(unguarded(cell("reason")), row.reason.as_deref().unwrap_or(""));
                    let labels: Value = serde_json::from_str(unguarded(cell("labels")))
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert_eq!(&labels, &row.labels);
                } else {
                    prop_assert_eq!(unguarded(cell("SubAccountName")), row.team_name.as_str());
                    let resource =
                        row.job_name.clone().unwrap_or_else(|| format!("{} reserved {}", row.team_name, row.gpu_class));
                    prop_assert_eq!(unguarded(cell("ResourceName")), resource.as_str());
                    if let Some(reason) = &row.reason {
                        let why = format!("; correction: {reason}");
                        prop_assert!(cell("ChargeDescription").ends_with(&why), "{:?}", cell("ChargeDescription"));
                    }
                    let tags: Value =
                        serde_json::from_str(cell("Tags")).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    if let Value::Object(labels) = &row.labels {
                        for (key, value) in labels.iter().filter(|(k, _)| !k.starts_with("fairway/")) {
                            prop_assert_eq!(&tags[key], value, "tag {:?}", key);
                        }
                    }
                    prop_assert_eq!(&tags["fairway/priority-class"], &row.priority_class);
                }
            }
        }
        Ok(())
    });
}

#[test]
fn every_json_line_is_a_row_with_its_text_as_written_and_the_control_record_counts_and_hashes_the_file() {
    fuzz(export_seeds(), export_rows(), |rows| {
        let (bytes, control) = export(Format::Json, &rows);
        let text = String::from_utf8(bytes.clone()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let lines: Vec<&str> = text.split_terminator('\n').collect();
        prop_assert_eq!(lines.len(), rows.len(), "one line per row and nothing else");
        for (row, line) in rows.iter().zip(lines) {
            let object: Value = serde_json::from_str(line).map_err(|e| TestCaseError::fail(format!("{e}: {line}")))?;
            prop_assert_eq!(&object["team"], &row.team_name);
            prop_assert_eq!(&object["job_name"], &json!(row.job_name));
            prop_assert_eq!(&object["reason"], &json!(row.reason));
            prop_assert_eq!(&object["labels"], &row.labels);
        }
        for format in [Format::Csv, Format::Json, Format::Focus] {
            let (bytes, control) =
                if format == Format::Json { (bytes.clone(), control.clone()) } else { export(format, &rows) };
            let sha256: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
            prop_assert_eq!(&control.sha256, &sha256, "{:?}", format);
            prop_assert_eq!(control.rows, rows.len() as u64);
            let gpu_milli_ms: i128 = rows.iter().map(|r| i128::from(r.gpu_milli_ms)).sum();
            prop_assert_eq!(&control.gpu_milli_ms, &gpu_milli_ms.to_string());
            prop_assert_eq!(&control.format, format.as_str());
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------
// The client's event-stream parser: `client::sse`, fed what a server (or anything at its
// address) sends, in whatever chunks the network cuts.
// ---------------------------------------------------------------------------------------------

/// A piece of an event stream: field lines, comments, blank lines, line ends of every kind,
/// and bytes that are none of these.
fn stream_pieces() -> impl Strategy<Value = Vec<u8>> {
    let piece = Union::new(vec![
        select(vec!["id: ", "event: ", "data: ", "data:", "retry: 5", ": keepalive", "id", "data", "event: end"])
            .prop_map(|s| s.as_bytes().to_vec())
            .boxed(),
        select(vec!["\n", "\r\n", "\r", "\n\n", "\r\n\r\n"]).prop_map(|s| s.as_bytes().to_vec()).boxed(),
        "[a-z0-9{}\":, é☕]{0,12}".prop_map(String::into_bytes).boxed(),
        vec(any::<u8>(), 0..6).boxed(),
    ]);
    vec(piece, 0..40).prop_map(|pieces| pieces.concat())
}

#[test]
fn an_event_stream_cut_anywhere_parses_into_the_same_frames_as_whole() {
    use fairway::client::sse::Parser;
    let seeds = corpus("sse").into_iter().map(|(name, bytes)| (name, (bytes, vec![1usize, 7, 64]))).collect();
    fuzz(seeds, (stream_pieces(), vec(1usize..64, 0..8)), |(bytes, cuts)| {
        let mut whole = Parser::default();
        let expected = whole.push(&bytes);
        let mut parser = Parser::default();
        let mut frames = Vec::new();
        let mut rest = bytes.as_slice();
        for cut in cuts {
            let (chunk, after) = rest.split_at(cut.min(rest.len()));
            frames.extend(parser.push(chunk));
            rest = after;
        }
        frames.extend(parser.push(rest));
        prop_assert_eq!(&frames, &expected);
        prop_assert_eq!(parser.last_id(), whole.last_id());
        for frame in &frames {
            prop_assert!(!frame.event.contains(['\n', '\r']), "an event name spans lines: {:?}", frame);
            prop_assert!(!frame.data.contains('\r'), "data kept a line end: {:?}", frame);
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------
// Logs read from clusters: a pod log's text, and the collector's cursor over what it read.
// ---------------------------------------------------------------------------------------------

/// Pod log text: lines with RFC 3339 times (some shared, some out of order), lines without,
/// long and empty ones, NUL and CR, and a cut at the end.
fn pod_log_texts() -> impl Strategy<Value = String> {
    let time = (0i64..5, 0u32..3).prop_map(|(s, ns)| format!("2026-11-25T10:00:0{s}.{ns:09}Z "));
    let line =
        (option::weighted(0.9, time), "[ -~\u{0}\r\u{e9}]{0,40}").prop_map(|(t, rest)| t.unwrap_or_default() + &rest);
    (vec(line, 0..30), any::<bool>()).prop_map(|(lines, cut)| {
        let text = lines.join("\n");
        if cut || text.is_empty() {
            text
        } else {
            text + "\n"
        }
    })
}

#[test]
fn a_pod_log_read_any_way_keeps_every_line_once_however_often_it_is_read_again() {
    use fairway::{
        backends::kubernetes::status::log_lines,
        control::logs::{fresh, Position},
    };
    let seeds =
        text_corpus("pod_logs").into_iter().map(|(name, text)| (name, (text, 1usize << 20, 100usize))).collect();
    fuzz(seeds, (pod_log_texts(), 1usize..2_000, 1usize..40), |(text, limit_bytes, limit)| {
        let lines = log_lines(&text, limit_bytes as i64, limit);
        prop_assert!(lines.len() <= limit);
        for line in &lines {
            prop_assert!(text.contains(&line.text), "{:?} is not text of the read", line.text);
        }
        // The collector keeps the read, then reads the same answer again from its cursor (a
        // backend filtering by the second repeats it): nothing is kept twice.
        let (kept, to) = fresh(&Position::default(), lines.clone());
        prop_assert_eq!(kept.len(), lines.len(), "a first read keeps every line");
        prop_assert!(kept.windows(2).all(|w| w[0].0 <= w[1].0), "kept in time order");
        prop_assert!(kept.iter().all(|(_, text)| !text.contains('\0') && text.len() <= 4096 + 32));
        let (again, same) = fresh(&to, lines);
        prop_assert!(again.is_empty(), "a repeated read kept {:?}", again);
        prop_assert_eq!(same, to);
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------
// CI federation: trust policies' claim patterns, and the token exchange's parameters.
// ---------------------------------------------------------------------------------------------

/// A pattern, and a value that is either random or the pattern with each `*` filled in.
fn patterns_and_values() -> impl Strategy<Value = (String, String)> {
    let pattern = text_of("ab/-.é*", 0..12);
    (pattern, vec(text_of("ab/-.é*", 0..4), 4), text_of("ab/-.é", 0..16), any::<bool>()).prop_map(
        |(pattern, fills, random, filled)| {
            let value = if filled {
                let mut fills = fills.into_iter().cycle();
                pattern.split('*').collect::<Vec<_>>().join(&fills.next().unwrap_or_default())
            } else {
                random
            };
            (pattern, value)
        },
    )
}

#[test]
fn a_claim_pattern_matches_exactly_what_the_same_glob_as_a_regular_expression_matches() {
    use fairway::domain::ci_trust::matches;
    fuzz(Vec::new(), patterns_and_values(), |(pattern, value)| {
        let reference = format!("^{}$", pattern.split('*').map(regex::escape).collect::<Vec<_>>().join(".*"));
        let reference = regex::Regex::new(&reference).expect("an escaped pattern is a regular expression");
        prop_assert_eq!(matches(&pattern, &value), reference.is_match(&value), "{:?} against {:?}", pattern, value);
        Ok(())
    });
}

/// Token exchange bodies: forms and JSON made of the real parameters (right, wrong, empty,
/// repeated) and a stranger, or any bytes.
fn exchange_bodies() -> impl Strategy<Value = (&'static str, Vec<u8>)> {
    let names = select(vec![
        "grant_type",
        "subject_token",
        "subject_token_type",
        "requested_token_type",
        "team",
        "actor_token",
        "",
    ]);
    let values = prop_oneof![
        select(vec![
            "urn:ietf:params:oauth:grant-type:token-exchange",
            "urn:ietf:params:oauth:token-type:id_token",
            "urn:ietf:params:oauth:token-type:jwt",
            "urn:ietf:params:oauth:token-type:access_token",
            "vision",
            "eyJhbGciOiJub25lIn0.e30.",
            "",
        ])
        .prop_map(String::from),
        text_of("az09-_.:/ \u{0}é%+&=\"{}", 0..24),
    ];
    let pairs = vec((names, values), 0..8);
    prop_oneof![
        pairs.clone().prop_map(|pairs| {
            ("application/x-www-form-urlencoded", serde_urlencoded::to_string(&pairs).unwrap_or_default().into_bytes())
        }),
        pairs.prop_map(|pairs| {
            let object: serde_json::Map<String, Value> =
                pairs.into_iter().map(|(k, v)| (k.to_owned(), Value::from(v))).collect();
            ("application/json", Value::Object(object).to_string().into_bytes())
        }),
        (select(vec!["application/x-www-form-urlencoded", "application/json"]), vec(any::<u8>(), 0..64)),
    ]
}

#[test]
fn any_token_exchange_body_is_read_into_its_parameters_or_refused_with_a_400() {
    use axum::extract::FromRequest as _;
    use fairway::api::token_exchange::ExchangeForm;
    const NAMES: [&str; 6] =
        ["grant_type", "subject_token", "subject_token_type", "requested_token_type", "team", "Content-Type"];
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
    fuzz(Vec::new(), exchange_bodies(), |(content_type, body)| {
        let request = Request::post("/api/v1/auth/token-exchange")
            .header("content-type", content_type)
            .body(Body::from(body.clone()))
            .expect("a request");
        let outcome = runtime.block_on(ExchangeForm::from_request(request, &())).and_then(|ExchangeForm(request)| {
            request.parameters().map(|(token, team)| {
                assert!(!token.is_empty(), "an empty subject token was taken");
                assert!(team.is_none_or(|t| !t.as_str().contains('\0')), "a team with NUL was taken");
            })
        });
        if let Err(error) = outcome {
            let problem = error.problem();
            prop_assert_eq!(problem.status, 400, "{:?} for {:?}", problem, String::from_utf8_lossy(&body));
            if problem.code == "malformed_request" {
                // A parameter of the exchange, or one the request should not have sent.
                let field = problem.field.unwrap_or_default();
                prop_assert!(!field.is_empty(), "a refusal that names no field");
                let known = NAMES.contains(&field.as_str()) || field == "body";
                prop_assert!(known || !body.is_empty(), "the field {:?} of an empty body", field);
            }
        }
        Ok(())
    });
}
