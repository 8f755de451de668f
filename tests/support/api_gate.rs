//! A relay a test puts in front of a node's admin API, to make that node
//! silent while its spdk_tgt serves on.

/// A node's admin API that can stop answering while the node's replicas
/// still serve over NVMe/TCP (a talon down, its spdk_tgt serving on): a TCP
/// relay in front of the API. [`Gate::silence`] drops every connection
/// through it and holds each new one open without an answer (a caller
/// waits until its own timeout); [`Gate::open`] relays again.
pub struct Gate {
    /// Where callers reach the API through the relay.
    pub addr: std::net::SocketAddr,
    silent: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Gate {
    /// A relay on 127.0.0.1 to the API at `to`, open.
    pub async fn start(to: std::net::SocketAddr) -> Self {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the gate");
        let addr = l.local_addr().expect("gate address");
        let (silent, watch) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((mut caller, _)) = l.accept().await {
                let mut watch = watch.clone();
                tokio::spawn(async move {
                    if *watch.borrow() {
                        // held open, never answered, until the gate opens
                        let _ = watch.wait_for(|s| !*s).await;
                        return;
                    }
                    let Ok(mut api) = tokio::net::TcpStream::connect(to).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut caller, &mut api) => {}
                        // silenced: the connection goes
                        _ = watch.wait_for(|s| *s) => {}
                    }
                });
            }
        });
        Self { addr, silent, task }
    }

    /// The API stops answering: connections through the relay dropped, new
    /// ones held without an answer.
    pub fn silence(&self) {
        self.silent.send_replace(true);
    }

    /// The API answers again.
    pub fn open(&self) {
        self.silent.send_replace(false);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.task.abort();
    }
}
