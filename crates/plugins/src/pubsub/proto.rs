//! The messages of APISIX's `pubsub.proto` (proto3), as prost types: the field numbers and
//! types are the protocol, so they are written out here rather than generated at build time.

/// Keeps the connection alive; `state` comes back in the pong.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CmdPing {
    #[prost(bytes = "vec", tag = "1")]
    pub state: Vec<u8>,
}

/// A placeholder command with no handler.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CmdEmpty {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CmdKafkaListOffset {
    #[prost(string, tag = "1")]
    pub topic: String,
    #[prost(int32, tag = "2")]
    pub partition: i32,
    #[prost(int64, tag = "3")]
    pub timestamp: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CmdKafkaFetch {
    #[prost(string, tag = "1")]
    pub topic: String,
    #[prost(int32, tag = "2")]
    pub partition: i32,
    #[prost(int64, tag = "3")]
    pub offset: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PubSubReq {
    #[prost(int64, tag = "1")]
    pub sequence: i64,
    #[prost(oneof = "pub_sub_req::Req", tags = "31, 32, 33, 34")]
    pub req: Option<pub_sub_req::Req>,
}

pub mod pub_sub_req {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Req {
        #[prost(message, tag = "31")]
        CmdEmpty(super::CmdEmpty),
        #[prost(message, tag = "32")]
        CmdPing(super::CmdPing),
        #[prost(message, tag = "33")]
        CmdKafkaFetch(super::CmdKafkaFetch),
        #[prost(message, tag = "34")]
        CmdKafkaListOffset(super::CmdKafkaListOffset),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ErrorResp {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PongResp {
    #[prost(bytes = "vec", tag = "1")]
    pub state: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KafkaMessage {
    #[prost(int64, tag = "1")]
    pub offset: i64,
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
    #[prost(bytes = "vec", tag = "3")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "4")]
    pub value: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KafkaFetchResp {
    #[prost(message, repeated, tag = "1")]
    pub messages: Vec<KafkaMessage>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KafkaListOffsetResp {
    #[prost(int64, tag = "1")]
    pub offset: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PubSubResp {
    #[prost(int64, tag = "1")]
    pub sequence: i64,
    #[prost(oneof = "pub_sub_resp::Resp", tags = "31, 32, 33, 34")]
    pub resp: Option<pub_sub_resp::Resp>,
}

pub mod pub_sub_resp {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Resp {
        #[prost(message, tag = "31")]
        ErrorResp(super::ErrorResp),
        #[prost(message, tag = "32")]
        PongResp(super::PongResp),
        #[prost(message, tag = "33")]
        KafkaFetchResp(super::KafkaFetchResp),
        #[prost(message, tag = "34")]
        KafkaListOffsetResp(super::KafkaListOffsetResp),
    }
}
