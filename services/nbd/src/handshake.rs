//! The fixed newstyle handshake: greeting, STARTTLS, extended headers or structured
//! replies, metadata contexts, and NBD_OPT_GO (with NBD_OPT_LIST to explain a missing
//! export, and NBD_OPT_EXPORT_NAME for servers without NBD_OPT_GO).

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::config::{BlockSize, Config, ExportInfo, MetaContext, MAX_PAYLOAD};
use crate::error::{Error, Result};
use crate::proto::{self, *};
use crate::tls;
use crate::transport::{BoxRead, BoxWrite, Transport};
use crate::wire::{self, Info, ReplyMode};

/// Most replies one option may produce before the client gives up on the server.
const MAX_META_CONTEXT_REPLIES: usize = 1024;
const MAX_INFO_REPLIES: usize = 256;
const MAX_LISTED_EXPORTS: usize = 16 * 1024;

/// The result of a successful handshake.
#[derive(Debug)]
pub(crate) struct Negotiated {
    pub info: ExportInfo,
    pub mode: ReplyMode,
}

/// Runs the handshake on `stream` and returns the negotiated state and the split stream.
///
/// `host` is the TCP host name, used as the TLS server name when none is configured.
pub(crate) async fn handshake<S: Transport>(
    mut stream: S,
    config: &Config,
    host: Option<&str>,
) -> Result<(Negotiated, BoxRead, BoxWrite)> {
    let no_zeroes = greet(&mut stream).await?;
    match &config.tls {
        None => {
            let negotiated = negotiate(&mut stream, config, false, no_zeroes).await?;
            let (r, w) = stream.into_halves();
            Ok((negotiated, r, w))
        }
        Some(tls_config) => {
            let client_config = tls::client_config(tls_config)?;
            let name = tls::server_name(tls_config, host)?;
            send_option(&mut stream, OPT_STARTTLS, &[]).await?;
            let (header, payload) = read_option_reply(&mut stream, OPT_STARTTLS).await?;
            match header.reply {
                REP_ACK => {}
                reply if reply & REP_FLAG_ERROR != 0 => {
                    abort(&mut stream).await;
                    return Err(Error::Tls(format!(
                        "the server will not start TLS: it answered NBD_OPT_STARTTLS with {}{}",
                        proto::reply_name(reply),
                        wire::option_error_message(&payload)
                            .map(|m| format!(": {m}"))
                            .unwrap_or_default()
                    )));
                }
                reply => return Err(unexpected(OPT_STARTTLS, reply)),
            }
            let connector = tokio_rustls::TlsConnector::from(client_config);
            let mut tls_stream = connector
                .connect(name, stream)
                .await
                .map_err(|e| Error::Tls(format!("handshake failed: {e}")))?;
            let negotiated = negotiate(&mut tls_stream, config, true, no_zeroes).await?;
            let (r, w) = tls_stream.into_halves();
            Ok((negotiated, r, w))
        }
    }
}

/// Reads the greeting, answers with the client flags; returns whether NO_ZEROES is on.
async fn greet<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> Result<bool> {
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting)
        .await
        .map_err(|e| Error::io("reading the server greeting", e))?;
    let flags = wire::parse_greeting(&greeting)?;
    if flags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(Error::Unsupported(
            "the server does not offer fixed newstyle negotiation".into(),
        ));
    }
    let no_zeroes = flags & FLAG_NO_ZEROES != 0;
    let mut client = FLAG_C_FIXED_NEWSTYLE;
    if no_zeroes {
        client |= FLAG_C_NO_ZEROES;
    }
    s.write_all(&client.to_be_bytes())
        .await
        .map_err(|e| Error::io("sending client flags", e))?;
    Ok(no_zeroes)
}

async fn send_option<S: AsyncWrite + Unpin>(s: &mut S, option: u32, data: &[u8]) -> Result<()> {
    s.write_all(&wire::encode_option(option, data))
        .await
        .map_err(|e| Error::io("sending an option", e))?;
    s.flush()
        .await
        .map_err(|e| Error::io("sending an option", e))
}

async fn read_option_reply<S: AsyncRead + Unpin>(
    s: &mut S,
    option: u32,
) -> Result<(wire::OptionReplyHeader, Vec<u8>)> {
    let mut raw = [0u8; 20];
    s.read_exact(&mut raw)
        .await
        .map_err(|e| Error::io("reading an option reply", e))?;
    let header = wire::parse_option_reply_header(&raw)?;
    if header.option != option {
        return Err(Error::protocol(format!(
            "the server answered {} ({}) while {} was asked",
            proto::option_name(header.option),
            header.option,
            proto::option_name(option)
        )));
    }
    let mut payload = vec![0u8; header.len as usize];
    s.read_exact(&mut payload)
        .await
        .map_err(|e| Error::io("reading an option reply", e))?;
    Ok((header, payload))
}

fn unexpected(option: u32, reply: u32) -> Error {
    Error::protocol(format!(
        "unexpected reply {} ({reply:#x}) to {}",
        proto::reply_name(reply),
        proto::option_name(option)
    ))
}

/// A soft disconnect during option haggling; best effort, the session is over anyway.
async fn abort<S: AsyncWrite + Unpin>(s: &mut S) {
    let _ = send_option(s, OPT_ABORT, &[]).await;
}

fn refused(option: u32, reply: u32, payload: &[u8], tls: bool) -> Error {
    let message = wire::option_error_message(payload);
    if reply == REP_ERR_TLS_REQD {
        if tls {
            return Error::protocol(format!(
                "the server answered {} with NBD_REP_ERR_TLS_REQD although TLS is running",
                proto::option_name(option)
            ));
        }
        return Error::TlsRequired(message);
    }
    Error::OptionRefused {
        option,
        reply,
        message,
    }
}

/// Sends an option without data that the server either acknowledges or refuses.
/// Returns whether it was acknowledged; "unsupported"-like refusals are not errors.
async fn toggle<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    option: u32,
    tls: bool,
) -> Result<bool> {
    send_option(s, option, &[]).await?;
    let (header, payload) = read_option_reply(s, option).await?;
    match header.reply {
        REP_ACK => Ok(true),
        REP_ERR_TLS_REQD | REP_ERR_SHUTDOWN => {
            let err = refused(option, header.reply, &payload, tls);
            abort(s).await;
            Err(err)
        }
        reply if reply & REP_FLAG_ERROR != 0 => Ok(false),
        reply => Err(unexpected(option, reply)),
    }
}

async fn negotiate<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    config: &Config,
    tls: bool,
    no_zeroes: bool,
) -> Result<Negotiated> {
    if config.export.len() > proto::MAX_STRING {
        return Err(Error::InvalidRequest(format!(
            "export name of {} bytes is longer than the {} the protocol allows",
            config.export.len(),
            proto::MAX_STRING
        )));
    }
    let mut mode = ReplyMode::Simple;
    if config.extended_headers && toggle(s, OPT_EXTENDED_HEADERS, tls).await? {
        mode = ReplyMode::Extended;
    }
    if mode == ReplyMode::Simple
        && config.structured_replies
        && toggle(s, OPT_STRUCTURED_REPLY, tls).await?
    {
        mode = ReplyMode::Structured;
    }
    let contexts = if mode != ReplyMode::Simple && !config.meta_contexts.is_empty() {
        set_meta_context(s, config, tls).await?
    } else {
        Vec::new()
    };
    let mut info = go(s, config, tls, no_zeroes, mode).await?;
    info.structured_replies = mode != ReplyMode::Simple;
    info.extended_headers = mode == ReplyMode::Extended;
    info.tls = tls;
    info.contexts = contexts;
    Ok(Negotiated { info, mode })
}

async fn set_meta_context<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    config: &Config,
    tls: bool,
) -> Result<Vec<MetaContext>> {
    if let Some(q) = config
        .meta_contexts
        .iter()
        .find(|q| q.len() > proto::MAX_STRING || !q.contains(':'))
    {
        return Err(Error::InvalidRequest(format!(
            "metadata context query '{q}' must be 'namespace:name' of at most {} bytes",
            proto::MAX_STRING
        )));
    }
    let data = wire::encode_meta_context(&config.export, &config.meta_contexts);
    send_option(s, OPT_SET_META_CONTEXT, &data).await?;
    let mut contexts: Vec<MetaContext> = Vec::new();
    loop {
        let (header, payload) = read_option_reply(s, OPT_SET_META_CONTEXT).await?;
        match header.reply {
            REP_ACK => return Ok(contexts),
            REP_META_CONTEXT => {
                let (id, name) = wire::parse_meta_context(&payload)?;
                if contexts.iter().any(|c| c.id == id) {
                    return Err(Error::protocol(format!(
                        "the server gave metadata context id {id} twice"
                    )));
                }
                if contexts.len() >= MAX_META_CONTEXT_REPLIES {
                    return Err(Error::protocol(format!(
                        "the server selected more than {MAX_META_CONTEXT_REPLIES} metadata contexts"
                    )));
                }
                contexts.push(MetaContext { id, name });
            }
            REP_ERR_TLS_REQD | REP_ERR_SHUTDOWN => {
                let err = refused(OPT_SET_META_CONTEXT, header.reply, &payload, tls);
                abort(s).await;
                return Err(err);
            }
            // Unsupported, unknown export, ...: no contexts; NBD_OPT_GO will say more.
            reply if reply & REP_FLAG_ERROR != 0 => return Ok(Vec::new()),
            reply => return Err(unexpected(OPT_SET_META_CONTEXT, reply)),
        }
    }
}

/// Checks NBD_INFO_BLOCK_SIZE: the minimum decides correctness and must be valid; the
/// preferred size only speed, so a bad one is replaced.
fn block_size(minimum: u32, preferred: u32, maximum: u32) -> Result<BlockSize> {
    if !minimum.is_power_of_two() || minimum > 65536 {
        return Err(Error::protocol(format!(
            "NBD_INFO_BLOCK_SIZE minimum {minimum} is not a power of two up to 65536"
        )));
    }
    if maximum < minimum {
        return Err(Error::protocol(format!(
            "NBD_INFO_BLOCK_SIZE maximum {maximum} is below the minimum {minimum}"
        )));
    }
    let preferred = if preferred.is_power_of_two() && preferred >= minimum {
        preferred
    } else {
        minimum.max(4096)
    };
    let maximum = maximum.min(MAX_PAYLOAD);
    // Every request must be a multiple of the minimum, so the usable maximum is too.
    let maximum = maximum - maximum % minimum;
    Ok(BlockSize {
        minimum,
        preferred,
        maximum,
    })
}

async fn go<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    config: &Config,
    tls: bool,
    no_zeroes: bool,
    mode: ReplyMode,
) -> Result<ExportInfo> {
    let data = wire::encode_go(
        &config.export,
        &[INFO_BLOCK_SIZE, INFO_NAME, INFO_DESCRIPTION],
    );
    send_option(s, OPT_GO, &data).await?;
    let mut info = ExportInfo {
        name: config.export.clone(),
        canonical_name: None,
        description: None,
        size: 0,
        flags: 0,
        block_size: BlockSize::default(),
        block_size_advertised: false,
        structured_replies: false,
        extended_headers: false,
        tls,
        contexts: Vec::new(),
    };
    let mut have_export = false;
    for _ in 0..MAX_INFO_REPLIES {
        let (header, payload) = read_option_reply(s, OPT_GO).await?;
        match header.reply {
            REP_INFO => match wire::parse_info(&payload)? {
                Info::Export { size, flags } => {
                    info.size = size;
                    info.flags = flags;
                    have_export = true;
                }
                Info::BlockSize {
                    minimum,
                    preferred,
                    maximum,
                } => {
                    info.block_size = block_size(minimum, preferred, maximum)?;
                    info.block_size_advertised = true;
                }
                Info::Name(name) => info.canonical_name = Some(name),
                Info::Description(d) => info.description = Some(d),
                Info::Unknown(_) => {}
            },
            REP_ACK => {
                if !have_export {
                    return Err(Error::protocol(
                        "the server accepted NBD_OPT_GO without sending NBD_INFO_EXPORT",
                    ));
                }
                return Ok(info);
            }
            REP_ERR_UNKNOWN => {
                let available = list_exports(s).await.unwrap_or(None);
                abort(s).await;
                return Err(Error::ExportNotFound {
                    export: config.export.clone(),
                    available,
                });
            }
            REP_ERR_UNSUP if mode != ReplyMode::Extended => {
                return export_name(s, config, tls, no_zeroes, info).await;
            }
            reply if reply & REP_FLAG_ERROR != 0 => {
                let err = refused(OPT_GO, reply, &payload, tls);
                abort(s).await;
                return Err(err);
            }
            reply => return Err(unexpected(OPT_GO, reply)),
        }
    }
    Err(Error::protocol(format!(
        "the server sent more than {MAX_INFO_REPLIES} replies to NBD_OPT_GO"
    )))
}

/// NBD_OPT_LIST: the export names, or None when the server will not list them.
pub(crate) async fn list_exports<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
) -> Result<Option<Vec<String>>> {
    send_option(s, OPT_LIST, &[]).await?;
    let mut names = Vec::new();
    loop {
        let (header, payload) = read_option_reply(s, OPT_LIST).await?;
        match header.reply {
            REP_SERVER => {
                if names.len() >= MAX_LISTED_EXPORTS {
                    return Err(Error::protocol(format!(
                        "the server lists more than {MAX_LISTED_EXPORTS} exports"
                    )));
                }
                names.push(wire::parse_server(&payload)?.0);
            }
            REP_ACK => return Ok(Some(names)),
            reply if reply & REP_FLAG_ERROR != 0 => return Ok(None),
            reply => return Err(unexpected(OPT_LIST, reply)),
        }
    }
}

/// The old way into transmission, for servers without NBD_OPT_GO.
async fn export_name<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    config: &Config,
    tls: bool,
    no_zeroes: bool,
    mut info: ExportInfo,
) -> Result<ExportInfo> {
    send_option(s, OPT_EXPORT_NAME, config.export.as_bytes()).await?;
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => Error::Disconnected(format!(
            "after NBD_OPT_EXPORT_NAME: the server refused export '{}'",
            config.export
        )),
        _ => Error::io("reading the NBD_OPT_EXPORT_NAME reply", e),
    })?;
    let (size, flags) = wire::parse_export_name_reply(&reply);
    if !no_zeroes {
        let mut zeroes = [0u8; 124];
        s.read_exact(&mut zeroes)
            .await
            .map_err(|e| Error::io("reading the NBD_OPT_EXPORT_NAME reply", e))?;
    }
    info.size = size;
    info.flags = flags;
    info.tls = tls;
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_are_checked_and_normalised() {
        assert_eq!(
            block_size(512, 4096, 1 << 30).unwrap(),
            BlockSize {
                minimum: 512,
                preferred: 4096,
                maximum: MAX_PAYLOAD
            }
        );
        assert_eq!(block_size(4096, 1000, 10_000).unwrap().maximum, 8192);
        assert_eq!(block_size(4096, 1000, 10_000).unwrap().preferred, 4096);
        assert!(block_size(3, 4096, 4096).is_err());
        assert!(block_size(1 << 17, 1 << 17, 1 << 20).is_err());
        assert!(block_size(4096, 4096, 512).is_err());
    }
}
