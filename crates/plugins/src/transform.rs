//! Plugins that transform the request or the response on their way through.

family! {
    // One line per plugin: its module's name.
    echo,
    mocking,
    proxy_buffering,
    proxy_cache,
    proxy_rewrite,
    redirect,
    response_rewrite,
}
