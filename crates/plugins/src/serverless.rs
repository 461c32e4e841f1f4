//! Serverless function calls: the request answered by a function platform instead of an
//! upstream (AWS Lambda through its API Gateway, Azure Functions, Apache OpenWhisk,
//! OpenFunction). Lambda, Azure and OpenFunction share `generic_upstream` (APISIX's
//! `serverless/generic-upstream.lua`): the client's request forwarded to `function_uri`,
//! the function's answer given back; each adds its authorization.

pub mod generic_upstream;

family! {
    aws_lambda,
    azure_functions,
    openwhisk,
    openfunction,
}
