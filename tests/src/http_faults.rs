//! A small HTTP server that misbehaves on purpose, for the HTTP source's fault tests: an
//! object that changes during a download, a server that lies about sizes or sends more
//! than asked, transient 503s, a server that always fails, a wrong Content-Range, a
//! redirect to a presigned-style URL that expires, and servers with weak or no validators.
//!
//! It speaks just enough HTTP/1.1 (one request per connection, `Connection: close`) over
//! tokio on 127.0.0.1, serving one object from memory at any path (except for
//! [`Fault::ExpiringRedirect`]), and records every request it answers ([`Seen`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

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
    /// Like a template server in front of an object store: any path answers
    /// `302 Location: /obj?exp=1`, and `/obj?exp=1` serves the object until it has
    /// served `after` ranged GETs. From then on it answers 403 (an expired presigned
    /// URL) and the redirect points to `/obj?exp=2`, which does what `renewal` says.
    /// Other `/obj` queries answer 403.
    ExpiringRedirect { after: usize, renewal: Renewal },
    /// Sends neither an ETag nor a Last-Modified.
    NoValidators,
    /// Sends a weak ETag (`W/"v1"`) and, with `last_modified`, a Last-Modified date. A
    /// request with `If-Match` gets 412 (a weak tag never matches: RFC 9110 13.1.1); with
    /// `changes_after`, from request `after` on the object has a later Last-Modified
    /// (and `W/"v2"`), and `If-Unmodified-Since` with the old date gets 412.
    WeakETag {
        last_modified: bool,
        changes_after: Option<usize>,
    },
}

/// What the renewed target of [`Fault::ExpiringRedirect`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Serves the same object.
    Serves,
    /// Answers 403 too.
    Expired,
    /// Serves another version (ETag `"v2"`; `If-Match: "v1"` gets 412).
    OtherVersion,
}

/// One request the server answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    /// The request target: path and query.
    pub target: String,
    pub range: Option<(u64, u64)>,
    pub if_match: Option<String>,
    pub if_unmodified_since: Option<String>,
    /// The status code answered.
    pub status: u16,
}

/// Last-Modified of the object, and of its second version.
pub const LAST_MODIFIED: [&str; 2] = [
    "Wed, 02 Dec 2026 10:00:00 GMT",
    "Wed, 02 Dec 2026 11:00:00 GMT",
];

/// State shared by the connections of one server.
struct Shared {
    data: Vec<u8>,
    fault: Fault,
    seen: Mutex<Vec<Seen>>,
    /// Ranged GETs served by `/obj?exp=1` ([`Fault::ExpiringRedirect`]).
    first_target_ranges: AtomicUsize,
    /// The `exp` the redirect points to.
    generation: AtomicUsize,
}

/// The running server; stops when dropped.
#[derive(Debug)]
pub struct FaultServer {
    port: u16,
    requests: Arc<AtomicUsize>,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("fault", &self.fault)
            .finish_non_exhaustive()
    }
}

impl FaultServer {
    /// Serves `data` with `fault` on an ephemeral port.
    pub async fn start(data: Vec<u8>, fault: Fault) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let requests = Arc::new(AtomicUsize::new(0));
        let shared = Arc::new(Shared {
            data,
            fault,
            seen: Mutex::new(Vec::new()),
            first_target_ranges: AtomicUsize::new(0),
            generation: AtomicUsize::new(1),
        });
        let counter = requests.clone();
        let state = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                let state = state.clone();
                tokio::spawn(async move {
                    let _ = serve(stream, &state, n).await;
                });
            }
        });
        Self {
            port,
            requests,
            shared,
            task,
        }
    }

    /// Every request answered so far, in the order answered.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().clone()
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
    target: String,
    range: Option<(u64, u64)>,
    if_match: Option<String>,
    if_unmodified_since: Option<String>,
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
    let mut first = lines.next().unwrap_or_default().split(' ');
    let method = first.next().unwrap_or_default().to_string();
    let target = first.next().unwrap_or_default().to_string();
    let mut range = None;
    let mut if_match = None;
    let mut if_unmodified_since = None;
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
            "if-unmodified-since" => if_unmodified_since = Some(value.to_string()),
            _ => {}
        }
    }
    Ok(Some(Request {
        method,
        target,
        range,
        if_match,
        if_unmodified_since,
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

/// An answer: status line, headers, body.
type Answer = (&'static str, Vec<String>, Vec<u8>);

fn empty(status: &'static str) -> Answer {
    (status, vec!["Content-Length: 0".into()], Vec::new())
}

async fn serve(mut stream: TcpStream, shared: &Shared, n: usize) -> std::io::Result<()> {
    let Some(req) = read_request(&mut stream).await? else {
        return Ok(());
    };
    let (status, headers, body) = answer(shared, &req, n);
    shared.seen.lock().push(Seen {
        method: req.method.clone(),
        target: req.target.clone(),
        range: req.range,
        if_match: req.if_match.clone(),
        if_unmodified_since: req.if_unmodified_since.clone(),
        status: status
            .split(' ')
            .next()
            .and_then(|c| c.parse().ok())
            .unwrap_or(0),
    });
    respond(&mut stream, status, &headers, &body).await
}

/// The validator headers of the object as request `n` finds it; the second value is its
/// strong ETag, when it has one.
fn validators(fault: Fault, n: usize) -> (Vec<String>, Option<&'static str>) {
    match fault {
        Fault::NoValidators => (Vec::new(), None),
        Fault::WeakETag {
            last_modified,
            changes_after,
        } => {
            let v = usize::from(changes_after.is_some_and(|after| n >= after));
            let mut h = vec![format!("ETag: W/\"v{}\"", v + 1)];
            if last_modified {
                h.push(format!("Last-Modified: {}", LAST_MODIFIED[v]));
            }
            (h, None)
        }
        Fault::ChangesAfter { after } | Fault::ChangesIgnoringIfMatch { after } if n >= after => {
            (vec!["ETag: \"v2\"".into()], Some("\"v2\""))
        }
        _ => (vec!["ETag: \"v1\"".into()], Some("\"v1\"")),
    }
}

fn answer(shared: &Shared, req: &Request, n: usize) -> Answer {
    let fault = shared.fault;
    if let Fault::ExpiringRedirect { after, renewal } = fault {
        return expiring_redirect(shared, req, after, renewal);
    }
    let probe = req.range == Some((0, 0));
    let after_probe = req.method == "GET" && !probe;
    if after_probe {
        match fault {
            Fault::UnavailableFirst { count } if n <= count + 2 => {
                return empty("503 Service Unavailable");
            }
            Fault::AlwaysFails => return empty("500 Internal Server Error"),
            _ => {}
        }
    }
    let (mut common, etag) = validators(fault, n);
    if let (Fault::ChangesAfter { .. }, Some(wanted)) = (fault, &req.if_match) {
        if Some(wanted.as_str()) != etag {
            return empty("412 Precondition Failed");
        }
    }
    if let Fault::WeakETag { last_modified, .. } = fault {
        // A weak tag never matches If-Match; a later Last-Modified fails If-Unmodified-Since.
        if req.if_match.is_some() {
            return empty("412 Precondition Failed");
        }
        if let (true, Some(since)) = (last_modified, &req.if_unmodified_since) {
            let now = common
                .iter()
                .find_map(|h| h.strip_prefix("Last-Modified: "));
            if now != Some(since.as_str()) {
                return empty("412 Precondition Failed");
            }
        }
    }
    common.push("Accept-Ranges: bytes".to_string());
    common.push("Content-Type: application/octet-stream".to_string());
    let told = match fault {
        Fault::LiesAboutSize { extra } => shared.data.len() as u64 + extra,
        _ => shared.data.len() as u64,
    };
    object(&shared.data, req, common, told, fault)
}

/// The object's answer to `req`: HEAD (announcing `told` bytes), the whole object, or a
/// range, with the range faults applied.
fn object(data: &[u8], req: &Request, mut h: Vec<String>, told: u64, fault: Fault) -> Answer {
    let size = data.len() as u64;
    let probe = req.range == Some((0, 0));
    if req.method == "HEAD" {
        h.push(format!("Content-Length: {told}"));
        return ("200 OK", h, Vec::new());
    }
    let Some((first, last)) = req.range else {
        h.push(format!("Content-Length: {size}"));
        return ("200 OK", h, data.to_vec());
    };
    let last = last.min(size.saturating_sub(1));
    if first > last {
        return (
            "416 Range Not Satisfiable",
            vec![
                format!("Content-Range: bytes */{size}"),
                "Content-Length: 0".into(),
            ],
            Vec::new(),
        );
    }
    let body = &data[first as usize..=last as usize];
    match fault {
        Fault::SendsMore { extra } if !probe => {
            h.push(format!("Content-Range: bytes {first}-{last}/{size}"));
            let mut more = body.to_vec();
            more.extend(std::iter::repeat_n(0xEEu8, extra));
            return ("206 Partial Content", h, more);
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
    ("206 Partial Content", h, body.to_vec())
}

/// [`Fault::ExpiringRedirect`]: the redirecting origin and its two targets.
fn expiring_redirect(shared: &Shared, req: &Request, after: usize, renewal: Renewal) -> Answer {
    let forbidden = || empty("403 Forbidden");
    let Some(query) = req.target.strip_prefix("/obj?") else {
        let exp = shared.generation.load(Ordering::SeqCst);
        return (
            "302 Found",
            vec![
                format!("Location: /obj?exp={exp}"),
                "Content-Length: 0".into(),
            ],
            Vec::new(),
        );
    };
    let etag = match query {
        "exp=1" => {
            if req.method == "GET" && req.range.is_some() {
                let k = shared.first_target_ranges.fetch_add(1, Ordering::SeqCst) + 1;
                if k > after {
                    // Expired: from now on the origin redirects to the renewed URL.
                    shared.generation.store(2, Ordering::SeqCst);
                    return forbidden();
                }
            } else if shared.generation.load(Ordering::SeqCst) > 1 {
                return forbidden();
            }
            "\"v1\""
        }
        "exp=2" => match renewal {
            Renewal::Serves => "\"v1\"",
            Renewal::Expired => return forbidden(),
            Renewal::OtherVersion => "\"v2\"",
        },
        _ => return forbidden(),
    };
    if req.if_match.as_deref().is_some_and(|m| m != etag) {
        return empty("412 Precondition Failed");
    }
    let h = vec![
        format!("ETag: {etag}"),
        "Accept-Ranges: bytes".to_string(),
        "Content-Type: application/octet-stream".to_string(),
    ];
    object(&shared.data, req, h, shared.data.len() as u64, Fault::None)
}
