//! Byte streams the client runs over: TCP, Unix sockets, TLS on either, or anything
//! else that reads and writes (an in-memory pipe in tests).
//!
//! After the handshake a stream is split into a read half for the reply reader and a
//! write half for senders. TCP and Unix sockets split without a lock; other streams use
//! tokio's generic split.

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

use crate::config::Address;
use crate::error::{Error, Result};

pub type BoxRead = Box<dyn AsyncRead + Send + Unpin>;
pub type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// A stream the client can run over.
pub trait Transport: AsyncRead + AsyncWrite + Send + Unpin + 'static {
    /// Splits the stream into independently usable halves.
    fn into_halves(self) -> (BoxRead, BoxWrite)
    where
        Self: Sized,
    {
        let (r, w) = tokio::io::split(self);
        (Box::new(r), Box::new(w))
    }
}

impl Transport for TcpStream {
    fn into_halves(self) -> (BoxRead, BoxWrite) {
        let (r, w) = self.into_split();
        (Box::new(r), Box::new(w))
    }
}

impl Transport for UnixStream {
    fn into_halves(self) -> (BoxRead, BoxWrite) {
        let (r, w) = self.into_split();
        (Box::new(r), Box::new(w))
    }
}

impl Transport for tokio::io::DuplexStream {}

impl<S: Transport> Transport for tokio_rustls::client::TlsStream<S> {}

/// A connected socket of either family.
#[derive(Debug)]
pub enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// Opens a socket to the server (TCP with Nagle off, as the protocol recommends).
pub async fn connect_socket(address: &Address) -> Result<Socket> {
    let fail = |e: std::io::Error| Error::Connect {
        address: address.to_string(),
        source: std::sync::Arc::new(e),
    };
    match address {
        Address::Tcp { host, port } => {
            let stream = TcpStream::connect((host.as_str(), *port))
                .await
                .map_err(fail)?;
            stream.set_nodelay(true).map_err(fail)?;
            Ok(Socket::Tcp(stream))
        }
        Address::Unix(path) => Ok(Socket::Unix(UnixStream::connect(path).await.map_err(fail)?)),
    }
}

impl<S: Transport> Transport for tokio_rustls::server::TlsStream<S> {}
