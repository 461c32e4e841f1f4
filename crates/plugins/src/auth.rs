//! Authentication and authorization: the plugins that find the consumer a request comes from
//! (key-auth, basic-auth, jwt-auth, hmac-auth, jwe-decrypt, ldap-auth, ldap-auth-advanced, and
//! multi-auth over them), openid-connect (bearer tokens and the login flow), cas-auth's single
//! sign-on, the external deciders (forward-auth, opa, authz-keycloak, authz-casbin's
//! policies, wolf-rbac), and the plugins that act on who it is (consumer-restriction, acl,
//! attach-consumer-label). Credentials are looked up in the snapshot's consumer index
//! ([`ferrisix_plugin_api::ConsumerIndex`]); secrets are compared in constant time and never
//! logged.

family! {
    acl,
    attach_consumer_label,
    authz_casbin,
    authz_casdoor,
    authz_keycloak,
    basic_auth,
    cas_auth,
    consumer_restriction,
    dingtalk_auth,
    feishu_auth,
    forward_auth,
    hmac_auth,
    jwe_decrypt,
    jwt_auth,
    key_auth,
    ldap_auth,
    ldap_auth_advanced,
    openid_connect,
    multi_auth,
    opa,
    wolf_rbac,
}
