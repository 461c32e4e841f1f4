//! Loggers: each request's log entry (`log_entry`, APISIX's `log-util`) sent to a log
//! pipeline through a batch processor (`batch_processor`, APISIX's), one file per logger.

pub mod batch_processor;

family! {}
