//! RFC 5424 syslog lines as APISIX's `apisix/utils/rfc5424.lua` writes them (syslog and
//! sls-logger), and log-util's RFC 3339 timestamp (loggly writes its own line around it).

use ferrisix_plugin_api::clock::CivilTime;

/// Facility SYSLOG (5).
pub const FACILITY_SYSLOG: u32 = 5;
/// Severity INFO (6).
pub const SEVERITY_INFO: u32 = 6;

/// log-util's `get_rfc3339_zulu_timestamp`: `2024-01-02T03:04:05.678Z`.
pub fn timestamp(ms: u64) -> String {
    let t = CivilTime::from_unix_secs(ms / 1000);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year,
        t.month,
        t.day,
        t.hour,
        t.minute,
        t.second,
        ms % 1000
    )
}

/// `rfc5424.encode(facility, severity, host, "apisix", pid, msg, structured_data)`:
/// `<pri>1 <time> <host or -> apisix <pid> - <sd or -> <msg>\n`, the structured data
/// `[logservice name="value" ...]` when `structured` is given.
pub fn encode(
    facility: u32,
    severity: u32,
    ms: u64,
    host: Option<&str>,
    pid: u32,
    msg: &str,
    structured: Option<&[(&str, &str)]>,
) -> String {
    let pri = facility * 8 + severity;
    let host = host.filter(|h| !h.is_empty()).unwrap_or("-");
    let sd = match structured {
        None => "-".to_owned(),
        Some(params) => {
            let mut sd = String::from("[logservice");
            for (name, value) in params {
                sd.push_str(&format!(" {name}=\"{value}\""));
            }
            sd.push(']');
            sd
        }
    };
    format!(
        "<{pri}>1 {} {host} apisix {pid} - {sd} {msg}\n",
        timestamp(ms)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines() {
        assert_eq!(
            encode(5, 6, 1_704_164_645_678, Some("gw.test"), 42, "{}", None),
            "<46>1 2024-01-02T03:04:05.678Z gw.test apisix 42 - - {}\n"
        );
        assert_eq!(
            encode(5, 6, 0, None, 1, "m", Some(&[("project", "p"), ("logstore", "l")])),
            "<46>1 1970-01-01T00:00:00.000Z - apisix 1 - [logservice project=\"p\" logstore=\"l\"] m\n"
        );
    }
}
