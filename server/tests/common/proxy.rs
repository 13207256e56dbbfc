//! A TCP proxy whose link can be cut: the network between Fairway and a backend's API, for
//! chaos tests. While cut, every open connection is torn down and new ones are closed at once
//! (as a dropped route or a restarted load balancer does); restored, it forwards again.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
};

use tokio::{net::TcpListener, task::AbortHandle};

/// A running proxy to one upstream address.
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    links: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
}

impl Proxy {
    /// Starts forwarding a loopback port to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let links: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let accept = tokio::spawn({
            let (cut, links) = (cut.clone(), links.clone());
            async move {
                loop {
                    let Ok((mut client, _)) = listener.accept().await else { continue };
                    if cut.load(Ordering::SeqCst) {
                        drop(client);
                        continue;
                    }
                    let link = tokio::spawn(async move {
                        if let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    });
                    let mut links = links.lock().unwrap();
                    links.retain(|l| !l.is_finished());
                    links.push(link.abort_handle());
                }
            }
        })
        .abort_handle();
        Self { addr, cut, links, accept }
    }

    /// Cuts the link: open connections are torn down, new ones refused until [`Proxy::restore`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for link in self.links.lock().unwrap().drain(..) {
            link.abort();
        }
    }

    /// Forwards again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}
