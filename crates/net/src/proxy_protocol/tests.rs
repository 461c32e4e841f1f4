use super::*;

use tokio::io::AsyncWriteExt;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn proxied(src: &str, dst: &str) -> ProxyHeader {
    ProxyHeader::Proxied {
        source: addr(src),
        destination: addr(dst),
    }
}

/// A v2 header: version 2, `command`, `family_proto`, and the address block.
fn v2(command: u8, family_proto: u8, block: &[u8]) -> Vec<u8> {
    let mut out = V2_SIGNATURE.to_vec();
    out.push(0x20 | command);
    out.push(family_proto);
    out.extend_from_slice(&u16::try_from(block.len()).unwrap().to_be_bytes());
    out.extend_from_slice(block);
    out
}

fn v2_tcp4() -> Vec<u8> {
    let mut block = vec![198, 51, 100, 7, 10, 0, 0, 1];
    block.extend_from_slice(&56324u16.to_be_bytes());
    block.extend_from_slice(&443u16.to_be_bytes());
    v2(1, 0x11, &block)
}

#[test]
fn v1_tcp4_and_tcp6() {
    let line = b"PROXY TCP4 198.51.100.7 10.0.0.1 56324 9100\r\nGET / HTTP/1.1\r\n";
    assert_eq!(
        parse(line),
        Parsed::Header(proxied("198.51.100.7:56324", "10.0.0.1:9100"), 45)
    );
    let line = b"PROXY TCP6 2001:db8::7 ::1 65535 1\r\n";
    assert_eq!(
        parse(line),
        Parsed::Header(proxied("[2001:db8::7]:65535", "[::1]:1"), line.len())
    );
    assert_eq!(
        parse(b"PROXY UNKNOWN\r\n"),
        Parsed::Header(ProxyHeader::Unknown, 15)
    );
    assert_eq!(
        parse(b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\nrest"),
        Parsed::Header(ProxyHeader::Unknown, 35)
    );
}

#[test]
fn v1_malformed_lines_are_refused() {
    for bad in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        b"PROXY TCP5 1.2.3.4 1.2.3.5 1 2\r\n",
        b"PROXY TCP4 1.2.3.4 1.2.3.5 1\r\n",
        b"PROXY TCP4 1.2.3.4 1.2.3.5 1 2 3\r\n",
        b"PROXY TCP4 1.2.3.4 1.2.3.5 1 65536\r\n",
        b"PROXY TCP4 1.2.3.4 1.2.3.5 +1 2\r\n",
        b"PROXY TCP4 1.2.3.4 1.2.3.5 01 2\r\n",
        b"PROXY TCP4 ::1 1.2.3.5 1 2\r\n",
        b"PROXY TCP6 1.2.3.4 ::1 1 2\r\n",
        b"PROXY TCP4 1.2.3.4  1.2.3.5 1 2\r\n",
        b"PROXY TCP4 1.2.3.4 1.2.3.5 1 2\n",
        b"PROXY\r\n",
        b"proxy TCP4 1.2.3.4 1.2.3.5 1 2\r\n",
        b"PROXY TCP4 1.2.3.\xff 1.2.3.5 1 2\r\n",
    ] {
        assert!(
            matches!(parse(bad), Parsed::Invalid(_)),
            "{:?} parsed as {:?}",
            String::from_utf8_lossy(bad),
            parse(bad)
        );
    }
}

#[test]
fn v1_over_107_bytes_is_refused() {
    // The longest legal line (TCP6 with the longest addresses) fits.
    let longest = format!(
        "PROXY TCP6 {0} {0} 65535 65535\r\n",
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
    );
    assert!(longest.len() <= V1_MAX_HEADER);
    assert!(matches!(parse(longest.as_bytes()), Parsed::Header(..)));
    let mut long = b"PROXY UNKNOWN ".to_vec();
    long.resize(V1_MAX_HEADER, b'x');
    assert!(matches!(parse(&long), Parsed::Invalid(_)));
    long.truncate(V1_MAX_HEADER - 1);
    assert_eq!(parse(&long), Parsed::Incomplete);
}

#[test]
fn every_prefix_of_a_header_is_incomplete() {
    let v1 = b"PROXY TCP4 198.51.100.7 10.0.0.1 56324 9100\r\n".to_vec();
    for header in [v1, v2_tcp4()] {
        for n in 0..header.len() {
            assert_eq!(
                parse(&header[..n]),
                Parsed::Incomplete,
                "prefix of {n} bytes"
            );
        }
        assert!(matches!(parse(&header), Parsed::Header(_, n) if n == header.len()));
    }
}

#[test]
fn v2_tcp4_tcp6_with_tlvs() {
    let mut header = v2_tcp4();
    header.extend_from_slice(b"payload");
    assert_eq!(
        parse(&header),
        Parsed::Header(proxied("198.51.100.7:56324", "10.0.0.1:443"), 28)
    );
    let src: Ipv6Addr = "2001:db8::7".parse().unwrap();
    let dst: Ipv6Addr = "2001:db8::1".parse().unwrap();
    let mut block = src.octets().to_vec();
    block.extend_from_slice(&dst.octets());
    block.extend_from_slice(&1234u16.to_be_bytes());
    block.extend_from_slice(&80u16.to_be_bytes());
    // A TLV (PP2_TYPE_AUTHORITY) after the addresses is skipped.
    block.extend_from_slice(&[0x02, 0x00, 0x03, b'a', b'.', b'b']);
    let header = v2(1, 0x21, &block);
    assert_eq!(
        parse(&header),
        Parsed::Header(
            proxied("[2001:db8::7]:1234", "[2001:db8::1]:80"),
            header.len()
        )
    );
}

#[test]
fn v2_local_unspec_and_unix_carry_no_address() {
    // LOCAL, whatever it says about addresses.
    let mut local = v2_tcp4();
    local[12] = 0x20;
    assert_eq!(parse(&local), Parsed::Header(ProxyHeader::Local, 28));
    assert_eq!(
        parse(&v2(0, 0x00, &[])),
        Parsed::Header(ProxyHeader::Local, 16)
    );
    assert_eq!(
        parse(&v2(1, 0x00, &[])),
        Parsed::Header(ProxyHeader::Unknown, 16)
    );
    let unix = v2(1, 0x31, &[0u8; 216]);
    assert_eq!(
        parse(&unix),
        Parsed::Header(ProxyHeader::Unknown, unix.len())
    );
}

#[test]
fn v2_malformed_headers_are_refused() {
    let mut bad_version = v2_tcp4();
    bad_version[12] = 0x11;
    let mut bad_command = v2_tcp4();
    bad_command[12] = 0x22;
    let mut bad_family = v2_tcp4();
    bad_family[13] = 0x41;
    let mut bad_signature = v2_tcp4();
    bad_signature[5] = b'X';
    let short_v4 = v2(1, 0x11, &[1, 2, 3, 4, 5, 6, 7, 8]);
    let short_v6 = v2(1, 0x21, &[0u8; 20]);
    let mut too_long = V2_SIGNATURE.to_vec();
    too_long.extend_from_slice(&[0x21, 0x11, 0xff, 0xff]);
    for bad in [
        bad_version,
        bad_command,
        bad_family,
        bad_signature,
        short_v4,
        short_v6,
        too_long,
    ] {
        assert!(matches!(parse(&bad), Parsed::Invalid(_)), "{bad:?}");
    }
}

#[test]
fn v1_header_written_as_nginx_writes_it() {
    assert_eq!(
        v1_header(addr("198.51.100.7:56324"), addr("127.0.0.1:9100")),
        "PROXY TCP4 198.51.100.7 127.0.0.1 56324 9100\r\n"
    );
    assert_eq!(
        v1_header(addr("[2001:db8::7]:1"), addr("[::1]:2")),
        "PROXY TCP6 2001:db8::7 ::1 1 2\r\n"
    );
    let mixed = v1_header(addr("198.51.100.7:1"), addr("[::1]:2"));
    assert_eq!(mixed, "PROXY TCP6 ::ffff:198.51.100.7 ::1 1 2\r\n");
    // What is written parses back.
    assert_eq!(
        parse(mixed.as_bytes()),
        Parsed::Header(proxied("[::ffff:198.51.100.7]:1", "[::1]:2"), mixed.len())
    );
}

/// A connected pair: the client side and the accepted side.
async fn pair() -> (TcpStream, TcpStream) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server, _) = listener.accept().await.unwrap();
    (client, server)
}

#[tokio::test]
async fn a_header_split_across_reads_is_read_whole_and_nothing_after_it() {
    let (mut client, mut server) = pair().await;
    let writer = tokio::spawn(async move {
        for part in [
            &b"PRO"[..],
            b"XY TCP4 198.51.100.7 ",
            b"10.0.0.1 5 6\r",
            b"\nhello",
        ] {
            client.write_all(part).await.unwrap();
            client.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        client
    });
    let header = read_header(&mut server, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(header, proxied("198.51.100.7:5", "10.0.0.1:6"));
    let _client = writer.await.unwrap();
    let mut rest = [0u8; 5];
    server.read_exact(&mut rest).await.unwrap();
    assert_eq!(&rest, b"hello");
}

#[tokio::test]
async fn a_v2_header_followed_by_data_leaves_the_data() {
    let (mut client, mut server) = pair().await;
    let mut bytes = v2_tcp4();
    bytes.extend_from_slice(b"\x16\x03\x01");
    client.write_all(&bytes).await.unwrap();
    let header = read_header(&mut server, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(header, proxied("198.51.100.7:56324", "10.0.0.1:443"));
    let mut rest = [0u8; 3];
    server.read_exact(&mut rest).await.unwrap();
    assert_eq!(&rest, b"\x16\x03\x01");
}

#[tokio::test]
async fn silent_truncated_and_bad_clients_are_given_up_on() {
    // Silent: the deadline.
    let (_client, mut server) = pair().await;
    let r = read_header(&mut server, Duration::from_millis(100)).await;
    assert!(matches!(r, Err(ReadError::Timeout)), "{r:?}");
    // Truncated, then closed.
    let (mut client, mut server) = pair().await;
    client.write_all(b"PROXY TCP4 1.2.3.4").await.unwrap();
    drop(client);
    let r = read_header(&mut server, Duration::from_secs(10)).await;
    assert!(matches!(r, Err(ReadError::Closed(_))), "{r:?}");
    // Not a header.
    let (mut client, mut server) = pair().await;
    client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let r = read_header(&mut server, Duration::from_secs(10)).await;
    assert!(matches!(r, Err(ReadError::Invalid(_))), "{r:?}");
    // A v1 line with no end, sent slowly in pieces: refused at 107 bytes.
    let (mut client, mut server) = pair().await;
    let writer = tokio::spawn(async move {
        client.write_all(b"PROXY UNKNOWN ").await.unwrap();
        for _ in 0..20 {
            if client.write_all(&[b'x'; 10]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let r = read_header(&mut server, Duration::from_secs(10)).await;
    assert!(matches!(r, Err(ReadError::Invalid(_))), "{r:?}");
    let _ = writer.await;
}

/// Mutated and cut headers never panic, and a header found never claims more bytes than
/// there are (a bounded, seeded stand-in for a fuzz run).
#[test]
fn mutated_headers_never_panic() {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let seeds = [
        b"PROXY TCP4 198.51.100.7 10.0.0.1 56324 9100\r\n".to_vec(),
        b"PROXY TCP6 2001:db8::7 ::1 65535 1\r\n".to_vec(),
        b"PROXY UNKNOWN\r\n".to_vec(),
        v2_tcp4(),
        v2(1, 0x21, &[7u8; 40]),
        v2(0, 0x31, &[1u8; 216]),
    ];
    for _ in 0..20_000 {
        let mut bytes = seeds[(next() % seeds.len() as u64) as usize].clone();
        for _ in 0..(next() % 4) {
            let at = (next() % bytes.len() as u64) as usize;
            bytes[at] = next() as u8;
        }
        bytes.truncate((next() % (bytes.len() as u64 + 1)) as usize);
        if let Parsed::Header(_, used) = parse(&bytes) {
            assert!(used <= bytes.len(), "{bytes:?}");
        }
    }
}

/// A v2 TCP4 header whose address block is followed by `tlvs`.
fn v2_tcp4_with(tlvs: &[u8]) -> Vec<u8> {
    let mut block = vec![192, 0, 2, 7, 10, 0, 0, 1];
    block.extend_from_slice(&56324u16.to_be_bytes());
    block.extend_from_slice(&9100u16.to_be_bytes());
    block.extend_from_slice(tlvs);
    v2(1, 0x11, &block)
}

fn tlv_bytes(kind: u8, value: &[u8]) -> Vec<u8> {
    let mut out = vec![kind];
    out.extend_from_slice(&(value.len() as u16).to_be_bytes());
    out.extend_from_slice(value);
    out
}

#[test]
fn tlvs_are_found_by_name_and_by_hex_type() {
    // PP2_TYPE_SSL: client 0x07, verify 0 (verified), then its sub-TLVs.
    let mut ssl = vec![0x07, 0, 0, 0, 0];
    ssl.extend(tlv_bytes(0x21, b"TLSv1.3"));
    ssl.extend(tlv_bytes(0x22, b"client.local"));
    ssl.extend(tlv_bytes(0x23, b"TLS_AES_128_GCM_SHA256"));
    let mut list = tlv_bytes(0x01, b"h2");
    list.extend(tlv_bytes(0x02, b"example.com"));
    list.extend(tlv_bytes(0x05, b"id-1"));
    list.extend(tlv_bytes(0x20, &ssl));
    list.extend(tlv_bytes(0xe0, b"custom"));
    list.extend(tlv_bytes(0x02, b"second.example.com"));
    let header = v2_tcp4_with(&list);
    let tlvs = tlvs_of(&header).expect("TLVs after the address block");
    assert_eq!(tlvs, &list[..]);
    let get = |name: &str| tlv(tlvs, name).map(|v| String::from_utf8_lossy(&v).into_owned());
    assert_eq!(get("alpn").as_deref(), Some("h2"));
    assert_eq!(get("0x01").as_deref(), Some("h2"));
    // The first of a type wins.
    assert_eq!(get("authority").as_deref(), Some("example.com"));
    assert_eq!(get("unique_id").as_deref(), Some("id-1"));
    assert_eq!(get("0xe0").as_deref(), Some("custom"));
    assert_eq!(get("0xE0").as_deref(), Some("custom"));
    assert_eq!(get("ssl_version").as_deref(), Some("TLSv1.3"));
    assert_eq!(get("ssl_0x21").as_deref(), Some("TLSv1.3"));
    assert_eq!(get("ssl_cn").as_deref(), Some("client.local"));
    assert_eq!(get("ssl_cipher").as_deref(), Some("TLS_AES_128_GCM_SHA256"));
    assert_eq!(get("ssl_verify").as_deref(), Some("0"));
    assert_eq!(tlv(tlvs, "ssl").map(|v| v.into_owned()), Some(ssl.clone()));
    // Absent types, unknown names, bad hex.
    for name in [
        "netns",
        "ssl_sig_alg",
        "0x03",
        "0x",
        "0xzz",
        "nosuch",
        "ssl_nosuch",
        "",
    ] {
        assert_eq!(get(name), None, "{name}");
    }
}

#[test]
fn tlvs_only_follow_a_proxied_inet_header() {
    let list = tlv_bytes(0x01, b"h2");
    assert_eq!(tlvs_of(&v2_tcp4_with(&[])), None);
    assert!(tlvs_of(&v2_tcp4_with(&list)).is_some());
    // LOCAL, AF_UNSPEC and v1 keep none.
    let mut local = v2_tcp4_with(&list);
    local[12] = 0x20;
    assert_eq!(tlvs_of(&local), None);
    assert_eq!(tlvs_of(&v2(1, 0x00, &list)), None);
    assert_eq!(tlvs_of(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n"), None);
    // A verify field needs the whole fixed part of the SSL TLV.
    let short = tlv_bytes(0x20, &[0x01, 0, 0]);
    assert_eq!(tlv(&short, "ssl_verify"), None);
    let mut verify = vec![0x01, 0, 0, 0, 0x12];
    verify.extend(tlv_bytes(0x22, b"cn"));
    let ssl = tlv_bytes(0x20, &verify);
    assert_eq!(tlv(&ssl, "ssl_verify").as_deref(), Some(&b"18"[..]));
    // A list broken before the type looked for answers nothing; one broken after it still
    // answers what came first.
    let mut broken = tlv_bytes(0x01, b"h2");
    broken.extend_from_slice(&[0x02, 0x00, 0x09, b'x']);
    assert_eq!(tlv(&broken, "alpn").as_deref(), Some(&b"h2"[..]));
    assert_eq!(tlv(&broken, "authority"), None);
}

#[tokio::test]
async fn read_header_with_tlvs_answers_them() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let list = tlv_bytes(0x02, b"example.com");
    let header = v2_tcp4_with(&list);
    let sent = header.clone();
    let client = tokio::spawn(async move {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(&sent).await.unwrap();
        c.write_all(b"after").await.unwrap();
        c
    });
    let (mut s, _) = listener.accept().await.unwrap();
    let (got, tlvs) = read_header_with_tlvs(&mut s, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(got, proxied("192.0.2.7:56324", "10.0.0.1:9100"));
    assert_eq!(tlvs.as_deref(), Some(&list[..]));
    let mut rest = [0u8; 5];
    s.read_exact(&mut rest).await.unwrap();
    assert_eq!(&rest, b"after");
    drop(client.await.unwrap());
}
