//! mqtt-proxy end to end with real MQTT software: two Debian `mosquitto` brokers behind stream
//! routes whose upstream hashes each session on the CONNECT packet's client id
//! (`chash` on `mqtt_client_id`, as APISIX's mqtt-proxy documentation sets it up), driven by
//! Debian's `mosquitto_pub` as an MQTT 3.1.1 and an MQTT 5 client. A `mosquitto_sub` on each
//! broker sees which broker every published message reached.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::debian::require;
use crate::support::{free_port, poll_until, Gateway};

/// A mosquitto broker on a free 127.0.0.1 port, with a subscriber to `ids/#` writing what it
/// receives (`topic payload` lines) to a file.
struct Broker {
    port: u16,
    broker: Child,
    subscriber: Child,
    seen: PathBuf,
    _dir: tempfile::TempDir,
}

impl Broker {
    fn start() -> Broker {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let conf = dir.path().join("mosquitto.conf");
        std::fs::write(
            &conf,
            format!(
                "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest stderr\n"
            ),
        )
        .unwrap();
        let broker = Command::new(require("mosquitto"))
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mosquitto");
        let up = poll_until(Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        assert!(up.is_some(), "mosquitto did not listen on {port}");
        let seen = dir.path().join("seen.txt");
        let subscriber = Command::new(require("mosquitto_sub"))
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-V", "mqttv311"])
            .args(["-t", "ids/#", "-v", "-q", "1"])
            .stdout(std::fs::File::create(&seen).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mosquitto_sub");
        let b = Broker {
            port,
            broker,
            subscriber,
            seen,
            _dir: dir,
        };
        // The subscription is in place once a message published straight to the broker
        // comes out of the subscriber.
        let subscribed = poll_until(Duration::from_secs(10), || {
            publish(b.port, "mqttv311", "probe", "ids/probe").0
                && b.lines().iter().any(|l| l == "ids/probe probe")
        });
        assert!(
            subscribed.is_some(),
            "mosquitto_sub never saw a message on {port}"
        );
        b
    }

    /// What the subscriber received, probes left out.
    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.seen)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn received(&self) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|l| !l.starts_with("ids/probe "))
            .collect()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.subscriber.kill();
        let _ = self.subscriber.wait();
        let _ = self.broker.kill();
        let _ = self.broker.wait();
    }
}

/// `mosquitto_pub` as client `id` (protocol `version`: `mqttv311` or `mqttv5`) publishing
/// its id to `topic` with QoS 1 on `port`: whether it exited 0 (the broker's PUBACK came
/// back), and its stderr. A client stuck past 20 s is killed and counts as failed.
fn publish(port: u16, version: &str, id: &str, topic: &str) -> (bool, String) {
    let mut child = Command::new(require("mosquitto_pub"))
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-V", version])
        .args(["-i", id, "-t", topic, "-m", id, "-q", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run mosquitto_pub");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return (status.success(), err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return (false, "mosquitto_pub did not finish".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Which broker (0 or 1) got the message `ids/<id> <id>`, once exactly one of them has it.
fn broker_of(brokers: &[Broker; 2], id: &str) -> Option<usize> {
    let line = format!("ids/{id} {id}");
    let hits: Vec<usize> = (0..2)
        .map(|i| brokers[i].received().iter().filter(|l| **l == line).count())
        .collect();
    match hits[..] {
        [1, 0] => Some(0),
        [0, 1] => Some(1),
        _ => None,
    }
}

#[test]
fn mqtt_proxy_routes_on_the_client_id_to_two_mosquitto_brokers() {
    let brokers = [Broker::start(), Broker::start()];
    let (v311, v5, udp) = (free_port(), free_port(), free_port());
    let route = |id: &str, port: u16, level: u8| {
        format!(
            "  - id: {id}\n    server_port: {port}\n    plugins:\n      mqtt-proxy:\n        protocol_name: MQTT\n        protocol_level: {level}\n    upstream:\n      type: chash\n      key: mqtt_client_id\n      nodes:\n        \"127.0.0.1:{a}\": 1\n        \"127.0.0.1:{b}\": 1\n",
            a = brokers[0].port,
            b = brokers[1].port,
        )
    };
    let routes = format!(
        "stream_routes:\n{}{}",
        route("mqtt4", v311, 4),
        route("mqtt5", v5, 5)
    );
    let keys = format!(
        "proxy_mode: http&stream\nstream_proxy:\n  tcp:\n    - \"127.0.0.1:{v311}\"\n    - \"127.0.0.1:{v5}\"\n  udp:\n    - \"127.0.0.1:{udp}\""
    );
    let _gw = Gateway::start_full(&routes, &keys, "");
    let ready = poll_until(Duration::from_secs(10), || {
        publish(v311, "mqttv311", "warm-up", "ids/warm-up").0
    });
    assert!(
        ready.is_some(),
        "an MQTT 3.1.1 publish through the gateway never succeeded: {}",
        publish(v311, "mqttv311", "warm-up", "ids/warm-up").1
    );

    // MQTT 3.1.1 on the level-4 route, MQTT 5 on the level-5 route, each client id twice.
    let ids: Vec<String> = (0..16).map(|i| format!("client-{i:02}")).collect();
    for (port, version, prefix) in [(v311, "mqttv311", "v311"), (v5, "mqttv5", "v5")] {
        let mut placed = [0usize; 2];
        for id in &ids {
            let id = format!("{prefix}-{id}");
            let (ok, err) = publish(port, version, &id, &format!("ids/{id}"));
            assert!(ok, "{version} {id}: {err}");
            let mut first = None;
            poll_until(Duration::from_secs(10), || {
                first = broker_of(&brokers, &id);
                first.is_some()
            });
            let first = first.unwrap_or_else(|| {
                panic!(
                    "{id} did not reach exactly one broker: {:?} / {:?}",
                    brokers[0].received(),
                    brokers[1].received()
                )
            });
            // The same client id goes to the same broker again.
            let again = format!("{id}-again");
            let (ok, err) = publish(port, version, &id, &format!("ids/{again}"));
            assert!(ok, "{version} {id} again: {err}");
            let line = format!("ids/{again} {id}");
            let mut landed = None;
            poll_until(Duration::from_secs(10), || {
                landed = (0..2).find(|&i| brokers[i].received().contains(&line));
                landed.is_some()
            });
            assert_eq!(landed, Some(first), "{id} moved to the other broker");
            placed[first] += 1;
        }
        // The ids spread over both brokers (the hash of these sixteen ids is fixed).
        assert!(
            placed[0] > 0 && placed[1] > 0,
            "{version}: every client id went to one broker: {placed:?}"
        );
    }

    // An MQTT 5 CONNECT on the MQTT 3.1.1 route, and 3.1.1 on the 5 one, are closed before
    // any broker sees them.
    for (port, version, id) in [(v311, "mqttv5", "wrong-5"), (v5, "mqttv311", "wrong-4")] {
        let (ok, _) = publish(port, version, id, &format!("ids/{id}"));
        assert!(!ok, "{version} was let through the other level's route");
    }
    // A message published after them still arrives, and theirs never did.
    let (ok, err) = publish(v311, "mqttv311", "last", "ids/last");
    assert!(ok, "{err}");
    assert!(
        poll_until(Duration::from_secs(10), || broker_of(&brokers, "last")
            .is_some())
        .is_some()
    );
    for b in &brokers {
        assert!(
            !b.received().iter().any(|l| l.contains("wrong-")),
            "{:?}",
            b.received()
        );
    }
}
