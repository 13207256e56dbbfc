//! A real OpenID provider and a CI token issuer on loopback, for the OpenID Connect tests.
//!
//! The provider is panva's certified `oidc-provider` (npm) and the CI issuer signs with `jose`,
//! both in one node process, `tests/oidc/peer.mjs` (see `tests/oidc/README.md`).
//! `.ci/install-oidc-provider` installs the packages once per machine; the script is copied
//! beside their `node_modules` (ES modules resolve packages from the script's directory) and
//! started once per [`OidcPeer`]. The peer dies with it: dropping it kills the process, and
//! the peer exits by itself when its stdin, held by this process, closes.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};
use tokio::{
    io::{AsyncBufReadExt as _, BufReader},
    process::{Child, Command},
};

/// The client id the provider registers for Fairway.
pub const CLIENT_ID: &str = "fairway";
/// The secret of client [`CLIENT_ID`] (`client_secret_basic`).
pub const CLIENT_SECRET: &str = "fairway-secret";

/// The peer's script, compiled in so that a change to it reaches the tests.
const PEER_SCRIPT: &str = include_str!("../oidc/peer.mjs");

/// A real OpenID provider (npm oidc-provider) and a CI issuer on loopback, for one test.
pub struct OidcPeer {
    /// `http://127.0.0.1:PORT`, where the test control endpoints (`/test/...`) are.
    pub base: String,
    /// The OpenID provider's issuer, `{base}/idp`.
    pub issuer: String,
    /// The CI issuer's issuer, `{base}/ci`.
    pub ci_issuer: String,
    http: reqwest::Client,
    /// Killed on drop; its stdin, a pipe it watches, closes with it.
    _child: Child,
}

/// The peer's script as installed beside `node_modules`, once per process: installs the npm
/// packages (once per machine) and writes the script under a name made of its digest, so
/// checkouts with different scripts share one install.
fn peer_script() -> &'static Path {
    static SCRIPT: OnceLock<PathBuf> = OnceLock::new();
    SCRIPT.get_or_init(|| {
        let installer = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/install-oidc-provider");
        let out = std::process::Command::new("bash")
            .arg(&installer)
            .stderr(Stdio::inherit())
            .output()
            .expect("run .ci/install-oidc-provider");
        assert!(
            out.status.success(),
            "the OpenID Connect tests need node and the npm packages oidc-provider and jose, and \
             .ci/install-oidc-provider could not install them (see its output above)"
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let dir = PathBuf::from(stdout.lines().last().expect("the installer prints a directory").trim());
        let digest: String = Sha256::digest(PEER_SCRIPT).iter().take(8).map(|b| format!("{b:02x}")).collect();
        let script = dir.join(format!("peer-{digest}.mjs"));
        if std::fs::read_to_string(&script).ok().as_deref() != Some(PEER_SCRIPT) {
            // Written whole, then renamed: other test processes never see half a script.
            let temp = dir.join(format!(".peer-{digest}.{}.tmp", std::process::id()));
            std::fs::write(&temp, PEER_SCRIPT).expect("write the OpenID peer's script");
            std::fs::rename(&temp, &script).expect("install the OpenID peer's script");
        }
        script
    })
}

impl OidcPeer {
    /// Starts the peer with `redirect_uris` and `post_logout_redirect_uris` registered for
    /// client `fairway`.
    pub async fn start(redirect_uris: &[String], post_logout_redirect_uris: &[String]) -> Self {
        let script = peer_script();
        let mut child = Command::new("node")
            .arg(script)
            .current_dir(script.parent().expect("the script's directory"))
            .env("OIDC_REDIRECT_URIS", redirect_uris.join(","))
            .env("OIDC_POST_LOGOUT_REDIRECT_URIS", post_logout_redirect_uris.join(","))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start node (the OpenID peer)");

        // The peer's stderr goes to the test's (shown when a test fails), and is kept for the
        // panic should the peer not start.
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let kept = Arc::clone(&stderr);
        let forward = tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("[oidc peer] {line}");
                let mut kept = kept.lock().expect("stderr buffer");
                if kept.len() < 64 * 1024 {
                    kept.push_str(&line);
                    kept.push('\n');
                }
            }
        });

        let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let ready = tokio::time::timeout(Duration::from_secs(60), async {
            while let Ok(Some(line)) = stdout.next_line().await {
                if let Some(json) = line.strip_prefix("READY ") {
                    return Some(serde_json::from_str::<Value>(json).expect("the peer's READY line"));
                }
            }
            None
        })
        .await;
        let ready = match ready {
            Ok(Some(ready)) => ready,
            Ok(None) => {
                let status = child.wait().await.expect("the OpenID peer's exit status");
                let _ = tokio::time::timeout(Duration::from_secs(5), forward).await;
                panic!("the OpenID peer exited ({status}) before it was ready:\n{}", stderr.lock().expect("stderr"));
            }
            Err(_) => panic!("the OpenID peer was not ready within 60 s:\n{}", stderr.lock().expect("stderr")),
        };
        // Anything the peer writes to stdout later joins its stderr (an unread pipe would break).
        tokio::spawn(async move {
            while let Ok(Some(line)) = stdout.next_line().await {
                eprintln!("[oidc peer] {line}");
            }
        });
        let field = |name: &str| ready[name].as_str().expect("a URL in the READY line").to_owned();
        Self {
            base: field("base"),
            issuer: field("issuer"),
            ci_issuer: field("ci_issuer"),
            http: reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("client"),
            _child: child,
        }
    }

    /// POSTs `body` to the control endpoint `path`; the response, whose status must be `expect`.
    async fn control(&self, path: &str, body: &Value, expect: u16) -> reqwest::Response {
        let response =
            self.http.post(format!("{}{path}", self.base)).json(body).send().await.expect("the OpenID peer answers");
        let status = response.status().as_u16();
        if status == expect {
            return response;
        }
        panic!("POST {path}: {status}, not {expect}: {}", response.text().await.unwrap_or_default());
    }

    /// Fairway's configuration of this provider as `corp` ("Acme SSO"), its groups granting
    /// `groups`.
    pub fn provider(&self, groups: Vec<fairway::config::GroupGrant>) -> fairway::config::OidcProvider {
        fairway::config::OidcProvider {
            id: "corp".into(),
            display_name: "Acme SSO".into(),
            issuer: self.issuer.clone(),
            client_id: CLIENT_ID.into(),
            client_secret: fairway::config::Secret::new(CLIENT_SECRET),
            scopes: ["openid", "profile", "email", "groups"].map(String::from).to_vec(),
            algorithms: vec!["RS256".into()],
            username_claim: "preferred_username".into(),
            groups_claim: "groups".into(),
            groups,
        }
    }

    /// Sets the groups the provider asserts for `account` (its `groups` claim).
    pub async fn set_groups(&self, account: &str, groups: &[&str]) {
        self.control(&format!("/test/accounts/{account}"), &json!({"groups": groups}), 204).await;
    }

    /// A CI ID token minted by the CI issuer; `request` is the JSON body of
    /// `POST /test/ci/token` (`claims`, `audience`, `expires_in`, `alg`, `key`, `issuer`; see
    /// `tests/oidc/README.md`).
    pub async fn ci_token(&self, request: Value) -> String {
        let response = self.control("/test/ci/token", &request, 200).await;
        let body: Value = response.json().await.expect("a JSON answer");
        body["token"].as_str().expect("a token").to_owned()
    }

    /// Rotates the CI issuer's signing key (the old one stays in its JWKS); returns the new
    /// key's `kid`.
    pub async fn rotate_ci_key(&self) -> String {
        let body: Value = self.control("/test/ci/rotate", &json!({}), 200).await.json().await.expect("a JSON answer");
        body["kid"].as_str().expect("a kid").to_owned()
    }

    /// Arms the GitHub-style token endpoint: returns the `(url, request_token)` a GitHub
    /// runner would see in `ACTIONS_ID_TOKEN_REQUEST_URL` / `ACTIONS_ID_TOKEN_REQUEST_TOKEN`.
    /// Tokens it issues carry `claims` over the CI issuer's defaults, and the audience the
    /// request names. Like GitHub's, the URL already has a query: append `&audience=...`.
    pub async fn arm_github(&self, claims: Value) -> (String, String) {
        let request_token = uuid::Uuid::new_v4().simple().to_string();
        self.control("/test/ci/github", &json!({"request_token": request_token, "claims": claims}), 204).await;
        (format!("{}/github?api-version=2.0", self.ci_issuer), request_token)
    }
}

/// Cookies by host, each `(name, value, path)`: what a browser would send back, for
/// [`authorize_as`] (the workspace's reqwest has no cookie store).
#[derive(Default)]
struct Cookies(HashMap<String, Vec<(String, String, String)>>);

impl Cookies {
    fn store(&mut self, url: &reqwest::Url, headers: &reqwest::header::HeaderMap) {
        let jar = self.0.entry(url.host_str().unwrap_or_default().to_owned()).or_default();
        for header in headers.get_all(reqwest::header::SET_COOKIE) {
            let header = header.to_str().unwrap_or_default();
            let mut parts = header.split(';').map(str::trim);
            let Some((name, value)) = parts.next().and_then(|p| p.split_once('=')) else { continue };
            let mut path = "/".to_owned();
            let mut expired = value.is_empty();
            for attribute in parts {
                let (key, val) = attribute.split_once('=').unwrap_or((attribute, ""));
                match key.to_ascii_lowercase().as_str() {
                    "path" => val.clone_into(&mut path),
                    "max-age" => expired |= val.parse::<i64>().is_ok_and(|age| age <= 0),
                    "expires" => expired |= val.contains("1970"),
                    _ => {}
                }
            }
            jar.retain(|(n, _, p)| !(n == name && *p == path));
            if !expired {
                jar.push((name.to_owned(), value.to_owned(), path));
            }
        }
    }

    fn header(&self, url: &reqwest::Url) -> String {
        let Some(jar) = self.0.get(url.host_str().unwrap_or_default()) else { return String::new() };
        jar.iter()
            .filter(|(_, _, path)| {
                url.path().starts_with(path.as_str())
                    && (path.ends_with('/')
                        || url.path().len() == path.len()
                        || url.path()[path.len()..].starts_with('/'))
            })
            .map(|(name, value, _)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Follows an authorization request URL through the provider's login form as `account` (a
/// client that keeps cookies and does not follow redirects itself, so each hop is seen),
/// returning the final redirect Location that points back to the relying party (the URL
/// starting with `stop_at_prefix`: the callback URL with code and state), without requesting
/// it.
pub async fn authorize_as(authorization_url: &str, account: &str, stop_at_prefix: &str) -> String {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let mut cookies = Cookies::default();
    let mut url = reqwest::Url::parse(authorization_url).expect("an absolute authorization URL");
    let mut hops = Vec::new();
    for _ in 0..20 {
        if url.as_str().starts_with(stop_at_prefix) {
            return url.into();
        }
        hops.push(url.to_string());
        let response = http
            .get(url.clone())
            .header(reqwest::header::COOKIE, cookies.header(&url))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        cookies.store(&url, response.headers());
        let status = response.status();
        let location =
            response.headers().get(reqwest::header::LOCATION).map(|l| l.to_str().expect("Location").to_owned());
        if let (true, Some(location)) = (status.is_redirection(), location) {
            url = url.join(&location).expect("a redirect Location");
            continue;
        }
        let body = response.text().await.unwrap_or_default();
        let action = body
            .find("<form")
            .and_then(|at| body[at..].split_once("action=\""))
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(action, _)| action.to_owned())
            .filter(|_| status.is_success() && body.contains("name=\"login\""));
        let Some(action) = action else {
            panic!("{url} answered {status}, neither a redirect nor the login form (hops: {hops:?}):\n{body}");
        };
        let form = url.join(&action).expect("the login form's action");
        let response = http
            .post(form.clone())
            .header(reqwest::header::COOKIE, cookies.header(&form))
            .form(&[("login", account)])
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {form}: {e}"));
        cookies.store(&form, response.headers());
        let status = response.status();
        let Some(location) = response.headers().get(reqwest::header::LOCATION) else {
            panic!("the login form answered {status}, not a redirect:\n{}", response.text().await.unwrap_or_default());
        };
        url = form.join(location.to_str().expect("Location")).expect("a redirect Location");
    }
    panic!("no redirect to {stop_at_prefix} within 20 hops: {hops:?}");
}
