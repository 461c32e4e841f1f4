//! Calling cloud providers' APIs: AWS Signature Version 4 (`sigv4`) and Google's
//! service-account tokens (`gcp_token`). The secret managers (`crate::secrets`) and plugins
//! (aws-lambda) share them.

pub mod gcp_token;
pub mod sigv4;
