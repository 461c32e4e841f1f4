//! APISIX's pub-sub framework (`apisix/core/pubsub.lua`): a client speaks protobuf commands
//! (`PubSubReq` of `apisix/include/apisix/model/pubsub.proto`) in binary WebSocket frames and
//! gets one `PubSubResp` per command, carrying the command's `sequence`. The proxy completes
//! the WebSocket handshake and hands the upgraded connection to [`serve`] with the commands'
//! handler (Kafka's: [`kafka`]).
//!
//! As APISIX's loop: a frame that is not protobuf is answered `error_resp` "wrong command"
//! with sequence 0; a request without a command is skipped; a command without a handler
//! (`cmd_empty`) is answered "unknown command"; a handler's failure is answered with its
//! message (code 0); `cmd_ping` is answered `pong_resp` with the ping's `state`. Frames other
//! than binary are skipped (logged); a close frame or a broken connection ends the loop, which
//! closes the WebSocket. Frames are limited to 65535 bytes of payload, lua-resty-websocket's
//! default, past which the connection ends.

pub mod kafka;
pub mod proto;

use futures_util::{SinkExt, StreamExt};
use prost::Message as _;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use self::proto::{pub_sub_req, pub_sub_resp, ErrorResp, PongResp, PubSubReq, PubSubResp};

/// lua-resty-websocket's default `max_payload_len`.
pub const MAX_PAYLOAD: usize = 65535;

/// What a pub-sub backend answers to its commands (ping and the unknown ones are the
/// framework's).
pub trait Commands: Send {
    /// The answer to one command: the response body, or the error message sent as
    /// `error_resp`. `None`: the backend has no handler for this command.
    fn handle(
        &mut self,
        cmd: pub_sub_req::Req,
    ) -> impl std::future::Future<Output = Option<Result<pub_sub_resp::Resp, String>>> + Send;
}

/// Runs the pub-sub loop over an upgraded WebSocket connection until the client closes it or
/// it breaks.
pub async fn serve<S, C>(io: S, mut commands: C)
where
    S: AsyncRead + AsyncWrite + Unpin,
    C: Commands,
{
    let config = WebSocketConfig::default()
        .max_frame_size(Some(MAX_PAYLOAD))
        .max_message_size(Some(MAX_PAYLOAD));
    let mut ws = WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await;
    while let Some(frame) = ws.next().await {
        let data = match frame {
            Ok(Message::Binary(data)) => data,
            Ok(Message::Close(_)) => break,
            Ok(other) => {
                // Control frames are answered by the WebSocket layer itself.
                if !matches!(other, Message::Ping(_) | Message::Pong(_)) {
                    tracing::warn!(
                        "pubsub server receive non-binary data, type: {}, data: {}",
                        frame_type(&other),
                        other.to_text().unwrap_or_default()
                    );
                }
                continue;
            }
            Err(e) => {
                tracing::error!("fatal error in pubsub websocket server, err: {e}");
                break;
            }
        };
        let resp = match answer(&data, &mut commands).await {
            Some(resp) => resp,
            None => continue,
        };
        if let Err(e) = ws.send(Message::Binary(resp.encode_to_vec().into())).await {
            tracing::error!("failed to send response to client, err: {e}");
        }
    }
    // Closing after the client's close frame only flushes the reply already queued.
    let _ = ws.close(None).await;
}

/// The answer to one binary frame, `None` when it gets none.
async fn answer<C: Commands>(data: &[u8], commands: &mut C) -> Option<PubSubResp> {
    let req = match PubSubReq::decode(data) {
        Ok(req) => req,
        Err(e) => {
            tracing::error!("pubsub server receives undecodable data, err: {e}");
            return Some(error(0, "wrong command".into()));
        }
    };
    let sequence = req.sequence;
    let Some(cmd) = req.req else {
        tracing::warn!("pubsub server receives empty command");
        return None;
    };
    let name = command_name(&cmd);
    let resp = match cmd {
        pub_sub_req::Req::CmdPing(ping) => Some(Ok(pub_sub_resp::Resp::PongResp(PongResp {
            state: ping.state,
        }))),
        other => commands.handle(other).await,
    };
    Some(match resp {
        Some(Ok(resp)) => PubSubResp {
            sequence,
            resp: Some(resp),
        },
        Some(Err(message)) => error(sequence, message),
        None => {
            tracing::error!(
                "pubsub callback handler not registered for the command, command: {name}"
            );
            error(sequence, "unknown command".into())
        }
    })
}

fn error(sequence: i64, message: String) -> PubSubResp {
    PubSubResp {
        sequence,
        resp: Some(pub_sub_resp::Resp::ErrorResp(ErrorResp {
            code: 0,
            message,
        })),
    }
}

fn command_name(cmd: &pub_sub_req::Req) -> &'static str {
    match cmd {
        pub_sub_req::Req::CmdEmpty(_) => "cmd_empty",
        pub_sub_req::Req::CmdPing(_) => "cmd_ping",
        pub_sub_req::Req::CmdKafkaFetch(_) => "cmd_kafka_fetch",
        pub_sub_req::Req::CmdKafkaListOffset(_) => "cmd_kafka_list_offset",
    }
}

fn frame_type(m: &Message) -> &'static str {
    match m {
        Message::Text(_) => "text",
        Message::Binary(_) => "binary",
        Message::Ping(_) => "ping",
        Message::Pong(_) => "pong",
        Message::Close(_) => "close",
        Message::Frame(_) => "continuation",
    }
}

#[cfg(test)]
mod tests {
    use super::proto::*;
    use super::*;

    struct NoBackend;

    impl Commands for NoBackend {
        async fn handle(
            &mut self,
            cmd: pub_sub_req::Req,
        ) -> Option<Result<pub_sub_resp::Resp, String>> {
            match cmd {
                pub_sub_req::Req::CmdKafkaFetch(f) => Some(Err(format!("no {}", f.topic))),
                _ => None,
            }
        }
    }

    async fn ask(req: &[u8]) -> Option<PubSubResp> {
        answer(req, &mut NoBackend).await
    }

    fn req(sequence: i64, cmd: pub_sub_req::Req) -> Vec<u8> {
        PubSubReq {
            sequence,
            req: Some(cmd),
        }
        .encode_to_vec()
    }

    #[tokio::test]
    async fn ping_pong_and_sequence() {
        let ping = pub_sub_req::Req::CmdPing(CmdPing {
            state: b"abc".to_vec(),
        });
        let resp = ask(&req(i64::MAX, ping)).await.unwrap();
        assert_eq!(resp.sequence, i64::MAX);
        assert_eq!(
            resp.resp,
            Some(pub_sub_resp::Resp::PongResp(PongResp {
                state: b"abc".to_vec()
            }))
        );
    }

    #[tokio::test]
    async fn errors_as_apisix() {
        let err = |seq, msg: &str| PubSubResp {
            sequence: seq,
            resp: Some(pub_sub_resp::Resp::ErrorResp(ErrorResp {
                code: 0,
                message: msg.into(),
            })),
        };
        // Not protobuf (a truncated length-delimited field).
        assert_eq!(ask(&[0x0a, 0x05, 1]).await, Some(err(0, "wrong command")));
        let empty = pub_sub_req::Req::CmdEmpty(CmdEmpty {});
        assert_eq!(ask(&req(7, empty)).await, Some(err(7, "unknown command")));
        let fetch = pub_sub_req::Req::CmdKafkaFetch(CmdKafkaFetch {
            topic: "t".into(),
            partition: 0,
            offset: 0,
        });
        assert_eq!(ask(&req(3, fetch)).await, Some(err(3, "no t")));
        // No command at all: no answer.
        assert_eq!(ask(&PubSubReq::default().encode_to_vec()).await, None);
        assert_eq!(ask(&[]).await, None);
    }
}
