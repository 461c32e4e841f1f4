//! Plugins that transform the request or the response on their way through, and those that
//! validate the request before it goes on (request-validation, oas-validator).

family! {
    // One line per plugin: its module's name.
    body_transformer,
    degraphql,
    dubbo_proxy,
    echo,
    error_page,
    graphql_proxy_cache,
    grpc_transcode,
    grpc_web,
    http_dubbo,
    mocking,
    oas_validator,
    proxy_buffering,
    proxy_cache,
    proxy_rewrite,
    redirect,
    request_validation,
    response_rewrite,
}
