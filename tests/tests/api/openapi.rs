//! The committed OpenAPI document and the docs page.

use fairway_tests::{call, TestApp};

fn committed() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../openapi/openapi.json");
    std::fs::read_to_string(path).expect("openapi/openapi.json is committed")
}

#[test]
fn the_committed_document_matches_the_code() {
    let generated = fairway::api::openapi_json();
    assert!(
        committed() == generated,
        "openapi/openapi.json is stale: run `cargo run -p fairway -- openapi > openapi/openapi.json`"
    );
}

#[tokio::test]
async fn the_served_document_is_the_committed_one() {
    let app = TestApp::spawn().await;
    let r = app.send(call("GET", "/api/v1/openapi.json")).await;
    r.assert_status(200);
    let served: serde_json::Value = r.json();
    let file: serde_json::Value = serde_json::from_str(&committed()).unwrap();
    assert_eq!(served, file);
    assert_eq!(served["openapi"], "3.1.0");
}

#[tokio::test]
async fn the_docs_page_loads_without_anything_from_the_internet() {
    let app = TestApp::spawn().await;
    let page = app.send(call("GET", "/api/docs/")).await;
    page.assert_status(200);
    let html = String::from_utf8_lossy(&page.body).into_owned();
    assert!(html.contains("swagger"), "{html}");
    assert!(!html.contains("https://") && !html.contains("http://"), "no remote assets: {html}");
    for asset in ["swagger-ui.css", "swagger-ui-bundle.js", "swagger-initializer.js"] {
        let r = app.send(call("GET", &format!("/api/docs/{asset}"))).await;
        r.assert_status(200);
        assert!(r.body.len() > 100, "{asset} is served from the binary");
    }
}
