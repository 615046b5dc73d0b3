//! A small HTTP server that misbehaves on purpose, for the HTTP source's fault tests: an
//! object that changes during a download, a server that lies about sizes or sends more
//! than asked, transient 503s, a server that always fails, a wrong Content-Range.
//!
//! It speaks just enough HTTP/1.1 (one request per connection, `Connection: close`) over
//! tokio on 127.0.0.1, serving one object from memory at any path.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How the server misbehaves. Requests are counted from 1 (HEAD and the opening
/// `bytes=0-0` probe are requests 1 and 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Behaves.
    None,
    /// From request `after` on the object has another ETag; `If-Match` with the old one
    /// gets 412.
    ChangesAfter { after: usize },
    /// Like `ChangesAfter`, but ignores `If-Match` and serves the new ETag with 206.
    ChangesIgnoringIfMatch { after: usize },
    /// HEAD says the object is `extra` bytes longer than its ranges say.
    LiesAboutSize { extra: u64 },
    /// Range answers after the probe carry `extra` bytes more than asked (no
    /// Content-Length, the connection closes after them).
    SendsMore { extra: usize },
    /// The first `count` GETs after the probe answer 503.
    UnavailableFirst { count: usize },
    /// Every GET after the probe answers 500.
    AlwaysFails,
    /// Range answers after the probe carry a Content-Range one byte off.
    WrongContentRange,
}

/// The running server; stops when dropped.
#[derive(Debug)]
pub struct FaultServer {
    port: u16,
    requests: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultServer {
    /// Serves `data` with `fault` on an ephemeral port.
    pub async fn start(data: Vec<u8>, fault: Fault) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let requests = Arc::new(AtomicUsize::new(0));
        let data = Arc::new(data);
        let counter = requests.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                let data = data.clone();
                tokio::spawn(async move {
                    let _ = serve(stream, &data, fault, n).await;
                });
            }
        });
        Self {
            port,
            requests,
            task,
        }
    }

    /// The object's URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/object.img", self.port)
    }

    /// Requests served so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Request {
    method: String,
    range: Option<(u64, u64)>,
    if_match: Option<String>,
}

async fn read_request(stream: &mut TcpStream) -> std::io::Result<Option<Request>> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut byte).await?;
        if n == 0 || buf.len() > 64 * 1024 {
            return Ok(None);
        }
        buf.extend_from_slice(&byte[..n]);
    }
    let text = String::from_utf8_lossy(&buf);
    let mut lines = text.split("\r\n");
    let method = lines
        .next()
        .and_then(|l| l.split(' ').next())
        .unwrap_or_default()
        .to_string();
    let mut range = None;
    let mut if_match = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "range" => {
                range = value
                    .strip_prefix("bytes=")
                    .and_then(|r| r.split_once('-'))
                    .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
            }
            "if-match" => if_match = Some(value.to_string()),
            _ => {}
        }
    }
    Ok(Some(Request {
        method,
        range,
        if_match,
    }))
}

async fn respond(
    stream: &mut TcpStream,
    status: &str,
    headers: &[String],
    body: &[u8],
) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    stream.shutdown().await
}

async fn serve(mut stream: TcpStream, data: &[u8], fault: Fault, n: usize) -> std::io::Result<()> {
    let Some(req) = read_request(&mut stream).await? else {
        return Ok(());
    };
    let size = data.len() as u64;
    let etag = match fault {
        Fault::ChangesAfter { after } | Fault::ChangesIgnoringIfMatch { after } if n >= after => {
            "\"v2\""
        }
        _ => "\"v1\"",
    };
    let probe = req.range == Some((0, 0));
    let after_probe = req.method == "GET" && !probe;
    if after_probe {
        match fault {
            Fault::UnavailableFirst { count } if n <= count + 2 => {
                return respond(
                    &mut stream,
                    "503 Service Unavailable",
                    &["Content-Length: 0".into()],
                    b"",
                )
                .await
            }
            Fault::AlwaysFails => {
                return respond(
                    &mut stream,
                    "500 Internal Server Error",
                    &["Content-Length: 0".into()],
                    b"",
                )
                .await
            }
            _ => {}
        }
    }
    if let (Fault::ChangesAfter { .. }, Some(wanted)) = (fault, &req.if_match) {
        if wanted != etag {
            return respond(
                &mut stream,
                "412 Precondition Failed",
                &["Content-Length: 0".into()],
                b"",
            )
            .await;
        }
    }
    let common = vec![
        format!("ETag: {etag}"),
        "Accept-Ranges: bytes".to_string(),
        "Content-Type: application/octet-stream".to_string(),
    ];
    if req.method == "HEAD" {
        let told = match fault {
            Fault::LiesAboutSize { extra } => size + extra,
            _ => size,
        };
        let mut h = common;
        h.push(format!("Content-Length: {told}"));
        return respond(&mut stream, "200 OK", &h, b"").await;
    }
    let Some((first, last)) = req.range else {
        let mut h = common;
        h.push(format!("Content-Length: {size}"));
        return respond(&mut stream, "200 OK", &h, data).await;
    };
    let last = last.min(size.saturating_sub(1));
    if first > last {
        return respond(
            &mut stream,
            "416 Range Not Satisfiable",
            &[
                format!("Content-Range: bytes */{size}"),
                "Content-Length: 0".into(),
            ],
            b"",
        )
        .await;
    }
    let body = &data[first as usize..=last as usize];
    let mut h = common;
    match fault {
        Fault::SendsMore { extra } if !probe => {
            h.push(format!("Content-Range: bytes {first}-{last}/{size}"));
            let mut more = body.to_vec();
            more.extend(std::iter::repeat_n(0xEEu8, extra));
            return respond(&mut stream, "206 Partial Content", &h, &more).await;
        }
        Fault::WrongContentRange if !probe => {
            h.push(format!(
                "Content-Range: bytes {}-{}/{size}",
                first + 1,
                last + 1
            ));
        }
        _ => h.push(format!("Content-Range: bytes {first}-{last}/{size}")),
    }
    h.push(format!("Content-Length: {}", body.len()));
    respond(&mut stream, "206 Partial Content", &h, body).await
}
