//! Authentication: the plugins that find the consumer a request comes from (key-auth,
//! basic-auth, jwt-auth, hmac-auth, and multi-auth over them), forward-auth (an external
//! service decides), and consumer-restriction, which acts on who it is. Credentials are
//! looked up in the snapshot's consumer index
//! ([`ferrisix_plugin_api::ConsumerIndex`]); secrets are compared in constant time and never
//! logged.

family! {
    basic_auth,
    consumer_restriction,
    forward_auth,
    hmac_auth,
    jwt_auth,
    key_auth,
    multi_auth,
}
