//! A real Prometheus server (Debian's, installed by `.ci/install-prometheus`) for tests:
//! scrapes what it is given every second; dropped, it is killed.

use std::{net::SocketAddr, path::PathBuf, process::Child};

/// One scrape job: a name, a target's address (`/metrics` on it), and a bearer token.
pub struct Target<'a> {
    pub job: &'a str,
    pub addr: SocketAddr,
    pub token: Option<&'a str>,
}

/// A running Prometheus server.
pub struct Prometheus {
    child: Child,
    /// Base URL, e.g. `http://127.0.0.1:40123`.
    pub url: String,
    _dir: PathBuf,
}

impl Prometheus {
    /// Starts a server scraping `targets` every second.
    pub fn start(targets: &[Target<'_>]) -> Self {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/install-prometheus");
        let installed = std::process::Command::new("bash").arg(script).output().expect("run .ci/install-prometheus");
        assert!(installed.status.success(), "{}", String::from_utf8_lossy(&installed.stderr));
        let binary = String::from_utf8_lossy(&installed.stdout).lines().last().expect("a path").to_owned();
        let dir = std::env::temp_dir().join(format!("fairway-prometheus-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut config = String::from("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n");
        for t in targets {
            config.push_str(&format!("  - job_name: {}\n", t.job));
            if let Some(token) = t.token {
                config.push_str(&format!("    authorization:\n      credentials: {token}\n"));
            }
            config.push_str(&format!("    static_configs:\n      - targets: ['{}']\n", t.addr));
        }
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = std::process::Command::new(binary)
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        Self { child, url: format!("http://127.0.0.1:{port}"), _dir: dir }
    }

    /// The samples of an instant query, as (labels, value); empty until scraped.
    pub async fn query(&self, http: &reqwest::Client, query: &str) -> Vec<(serde_json::Value, String)> {
        let Ok(r) = http.get(format!("{}/api/v1/query", self.url)).query(&[("query", query)]).send().await else {
            return Vec::new();
        };
        let body: serde_json::Value = r.json().await.unwrap_or_default();
        body["data"]["result"]
            .as_array()
            .map(|rows| {
                rows.iter().map(|r| (r["metric"].clone(), r["value"][1].as_str().unwrap_or("").to_owned())).collect()
            })
            .unwrap_or_default()
    }

    /// Waits until every target's `up` is 1, or panics after a minute saying which were not.
    pub async fn wait_until_up(&self, http: &reqwest::Client, jobs: &[&str]) {
        let started = std::time::Instant::now();
        loop {
            let mut down = Vec::new();
            for job in jobs {
                let up = self.query(http, &format!("up{{job=\"{job}\"}}")).await;
                if up.first().is_none_or(|(_, v)| v != "1") {
                    down.push(*job);
                }
            }
            if down.is_empty() {
                return;
            }
            assert!(started.elapsed().as_secs() < 60, "Prometheus did not scrape {down:?} successfully");
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self._dir);
    }
}
