//! The handshake over a real socket pair: tokens, refusals and version mismatches.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::Duration;

use rgpu_protocol::{LaneAttach, LaneKey, Preamble, PROTOCOL_VERSION};
use rgpu_transport::{
    accept_preamble, client_handshake, server_handshake, tell_queued, Applicant, ClientHello,
    ClientSecurity, Endpoint, Fingerprint, Introduction, Plaintext, ServerSecurity, Stream,
    TlsConnector, TlsIdentity, TlsMode, Token, TransportError,
};

const KEY: LaneKey = [9; 32];

fn token(text: &str) -> Token {
    Token::new(text.as_bytes().to_vec()).unwrap()
}

fn plain() -> TlsConnector {
    TlsConnector::new(&ClientSecurity::default()).unwrap()
}

fn pair_endpoint() -> Endpoint {
    Endpoint::Unix("socketpair".into())
}

type Admit = fn(&Applicant, &Stream) -> Result<(), String>;

fn sessions_only(applicant: &Applicant, _: &Stream) -> Result<(), String> {
    match applicant.lane {
        None => Ok(()),
        Some(_) => Err("no lanes here".into()),
    }
}

/// The server's whole side: the preamble, then the handshake.
fn serve(
    mut stream: Stream,
    security: &ServerSecurity,
    token: Option<&Token>,
    admit: Admit,
) -> Result<(Stream, ClientHello), TransportError> {
    let route = accept_preamble(&mut stream, security, token)?;
    server_handshake(
        stream,
        &route,
        security,
        token,
        "test-server",
        77,
        KEY,
        admit,
    )
}

/// Runs both sides; returns (client result, server result).
fn handshake(
    server_token: Option<Token>,
    client_token: Option<Token>,
) -> (Result<u64, TransportError>, Result<String, TransportError>) {
    let (a, b) = UnixStream::pair().unwrap();
    let server = thread::spawn(move || {
        serve(
            Stream::Unix(b),
            &ServerSecurity::default(),
            server_token.as_ref(),
            sessions_only,
        )
        .map(|(_, hello)| hello.name)
    });
    let client = client_handshake(
        Stream::Unix(a),
        &plain(),
        &pair_endpoint(),
        client_token.as_ref(),
        "test-client",
        None,
    )
    .map(|(_, w)| w.session_id);
    (client, server.join().unwrap())
}

#[test]
fn matching_tokens_authenticate_both_ways() {
    let (client, server) = handshake(
        Some(token("0123456789abcdef-secret")),
        Some(token("0123456789abcdef-secret")),
    );
    assert_eq!(client.unwrap(), 77);
    assert_eq!(server.unwrap(), "test-client");
}

/// A client whose server makes it wait (exclusive use by another application) hears how many
/// wait before it, keeps waiting past the handshake's usual timeout's worth of notices, and is
/// welcomed; the server learns its application and how long it waits.
#[test]
fn a_queued_client_waits_for_its_welcome() {
    let (a, b) = UnixStream::pair().unwrap();
    let server = thread::spawn(move || {
        let mut stream = Stream::Unix(b);
        let security = ServerSecurity::default();
        let route = accept_preamble(&mut stream, &security, None)?;
        let mut asked = None;
        server_handshake(
            stream,
            &route,
            &security,
            None,
            "s",
            5,
            KEY,
            |applicant, stream| {
                asked = Some((applicant.application.clone(), applicant.wait));
                for ahead in [2, 1, 0] {
                    tell_queued(stream, ahead).map_err(|e| e.to_string())?;
                    thread::sleep(Duration::from_millis(50));
                }
                Ok(())
            },
        )?;
        Ok::<_, TransportError>(asked)
    });
    let introduction = Introduction {
        name: "queued",
        application: "job-42",
        wait: Duration::from_secs(30),
    };
    let (_, welcome) = client_handshake(
        Stream::Unix(a),
        &plain(),
        &pair_endpoint(),
        None,
        introduction,
        None,
    )
    .unwrap();
    assert_eq!(welcome.session_id, 5);
    let asked = server.join().unwrap().unwrap();
    assert_eq!(asked, Some(("job-42".to_string(), Duration::from_secs(30))));
}

#[test]
fn no_token_on_either_side_is_fine_for_local_peers() {
    let (client, server) = handshake(None, None);
    assert_eq!(client.unwrap(), 77);
    assert!(server.is_ok());
}

#[test]
fn wrong_token_is_refused() {
    let (client, server) = handshake(
        Some(token("0123456789abcdef-secret")),
        Some(token("not-the-right-token-at-all")),
    );
    let err = client.unwrap_err().to_string();
    assert!(err.contains("wrong or missing token"), "{err}");
    assert!(matches!(server, Err(TransportError::Auth(_))));
}

#[test]
fn missing_client_token_is_explained() {
    let (client, _server) = handshake(Some(token("0123456789abcdef-secret")), None);
    let err = client.unwrap_err().to_string();
    assert!(err.contains("RGPU_TOKEN"), "{err}");
}

#[test]
fn short_tokens_are_rejected() {
    assert!(Token::new(b"short".to_vec()).is_err());
}

#[test]
fn version_mismatch_is_a_clear_error() {
    // A newer server, and an older one whose preamble is shorter (12 bytes in version 3).
    for (version, len) in [(PROTOCOL_VERSION + 1, Preamble::LEN), (3, 12)] {
        let (a, mut b) = UnixStream::pair().unwrap();
        let fake_server = thread::spawn(move || {
            let mut preamble = Preamble::server(0).encode();
            preamble[4..8].copy_from_slice(&version.to_le_bytes());
            b.write_all(&preamble[..len]).unwrap();
            let mut theirs = [0u8; 12];
            let _ = b.read_exact(&mut theirs);
        });
        let err = client_handshake(Stream::Unix(a), &plain(), &pair_endpoint(), None, "c", None)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("version mismatch"), "{err}");
        assert!(err.contains(&format!("speaks version {version}")), "{err}");
        fake_server.join().unwrap();
    }
}

/// An older client (a 12-byte preamble, then waiting for the server's) hears our version at
/// once instead of waiting for bytes it will never send.
#[test]
fn an_older_client_hears_the_version_at_once() {
    let (mut a, b) = UnixStream::pair().unwrap();
    let server = thread::spawn(move || {
        let mut stream = Stream::Unix(b);
        accept_preamble(&mut stream, &ServerSecurity::default(), None).err()
    });
    let mut old = [0u8; 12];
    old[0..4].copy_from_slice(b"RGPU");
    old[4..8].copy_from_slice(&3u32.to_le_bytes());
    a.write_all(&old).unwrap();
    a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut reply = [0u8; 12];
    a.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[0..4], b"RGPU");
    assert_eq!(
        u32::from_le_bytes(reply[4..8].try_into().unwrap()),
        PROTOCOL_VERSION
    );
    let err = server.join().unwrap().expect("refused").to_string();
    assert!(err.contains("version mismatch"), "{err}");
}

/// A client reaching a web server by mistake says so at once: the preamble's empty line makes
/// the server answer, and its answer is no rgpu preamble.
#[test]
fn a_web_server_is_named_at_once() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let web = thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        // Reads a request up to its empty line, as an HTTP server does, then answers.
        let mut request = Vec::new();
        let mut byte = [0u8; 1];
        while !request.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap() == 1 {
            request.push(byte[0]);
        }
        conn.write_all(b"HTTP/1.0 400 Bad Request\r\n\r\n").unwrap();
    });
    let endpoint = Endpoint::parse(&format!("127.0.0.1:{port}")).unwrap();
    let stream = Stream::connect(&endpoint, Duration::from_secs(5)).unwrap();
    let err = client_handshake(stream, &plain(), &endpoint, None, "c", None)
        .err()
        .unwrap()
        .to_string();
    // The web server's own answer is named (not the handshake's timeout).
    assert!(err.contains("not an rgpu server"), "{err}");
    assert!(err.contains("HTTP/1.0"), "{err}");
    web.join().unwrap();
}

/// A data lane joins only with the session's key: the server's admission decides, and a
/// refused lane hears why.
#[test]
fn lanes_join_only_with_the_key() {
    for (key, admitted) in [(KEY, true), ([1; 32], false)] {
        let (a, b) = UnixStream::pair().unwrap();
        let server = thread::spawn(move || {
            let mut stream = Stream::Unix(b);
            let route = accept_preamble(&mut stream, &ServerSecurity::default(), None)?;
            assert_eq!(route.lane_of, Some(77));
            server_handshake(
                stream,
                &route,
                &ServerSecurity::default(),
                None,
                "s",
                78,
                [0; 32],
                |applicant, _| {
                    let lane = applicant.lane.ok_or("expected a lane")?;
                    if lane.session == 77 && lane.key == KEY && lane.index == 2 {
                        Ok(())
                    } else {
                        Err("not a lane of a session here".into())
                    }
                },
            )
            .map(|(_, hello)| hello.lane)
        });
        let lane = LaneAttach {
            session: 77,
            key,
            index: 2,
        };
        let client = client_handshake(
            Stream::Unix(a),
            &plain(),
            &pair_endpoint(),
            None,
            "c",
            Some(lane),
        );
        let server = server.join().unwrap();
        if admitted {
            assert!(client.is_ok());
            assert_eq!(server.unwrap(), Some(lane));
        } else {
            let err = client.err().expect("refused").to_string();
            assert!(err.contains("not a lane"), "{err}");
            assert!(server.is_err());
        }
    }
}

// ------------------------------------------------------------------------------------ TLS

fn identity() -> TlsIdentity {
    TlsIdentity::generate(&["localhost".into()]).unwrap()
}

fn tls_server(identity: &TlsIdentity, plaintext: Plaintext) -> ServerSecurity {
    ServerSecurity {
        tls: Some(identity.server_config().unwrap()),
        plaintext,
    }
}

/// A loopback TCP server running `serve` once; the client side connects with `security`.
fn over_tcp(
    server_security: ServerSecurity,
    client_security: ClientSecurity,
    host: &str,
    after: fn(Stream, Stream),
) -> (Result<(), TransportError>, Result<(), TransportError>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = thread::spawn(move || {
        let (socket, _) = listener.accept().unwrap();
        let server_token = token("0123456789abcdef-secret");
        serve(
            Stream::Tcp(socket),
            &server_security,
            Some(&server_token),
            sessions_only,
        )
    });
    let endpoint = Endpoint::parse(&format!("{host}:{port}")).unwrap();
    let connector = match TlsConnector::new(&client_security) {
        Ok(connector) => connector,
        Err(e) => panic!("{e}"),
    };
    let socket = Stream::connect(&endpoint, Duration::from_secs(5)).unwrap();
    let client_token = token("0123456789abcdef-secret");
    let client = client_handshake(
        socket,
        &connector,
        &endpoint,
        Some(&client_token),
        "tls-client",
        None,
    );
    let server = server.join().unwrap();
    match (client, server) {
        (Ok((client, _)), Ok((server, _))) => {
            after(client, server);
            (Ok(()), Ok(()))
        }
        (client, server) => (client.map(|_| ()), server.map(|_| ())),
    }
}

fn pinned(fingerprint: Fingerprint) -> ClientSecurity {
    ClientSecurity {
        mode: TlsMode::On,
        pins: vec![fingerprint],
        ca_file: None,
    }
}

/// Both directions at once, several MiB each way, through clones of one TLS stream per side
/// (a reading and a writing thread each, as sessions use them): every byte arrives, in order.
fn exchange_both_ways(client: Stream, server: Stream) {
    assert!(matches!(client, Stream::Tls(_)), "{client:?}");
    const LEN: usize = 6 << 20;
    let pattern = |seed: u8| -> Vec<u8> {
        (0..LEN)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    };
    let send = |mut stream: Stream, seed: u8| {
        thread::spawn(move || {
            let data = pattern(seed);
            for piece in data.chunks(1 << 20) {
                stream.write_all(piece).unwrap();
            }
        })
    };
    let receive = |mut stream: Stream, seed: u8| {
        thread::spawn(move || {
            // Reads of sizes smaller and larger than a record, so that records are opened in
            // place and straight into the reader's buffer.
            let mut got = vec![0u8; LEN];
            let sizes = [1, 5, (16 << 10) + 7, 100_000, 3, 1 << 20].iter().cycle();
            let mut at = 0;
            for size in sizes {
                let n = (*size).min(LEN - at);
                stream.read_exact(&mut got[at..at + n]).unwrap();
                at += n;
                if at == LEN {
                    break;
                }
            }
            assert!(got == pattern(seed), "data corrupted");
        })
    };
    let threads = [
        send(client.try_clone().unwrap(), 1),
        receive(server.try_clone().unwrap(), 1),
        send(server.try_clone().unwrap(), 2),
        receive(client.try_clone().unwrap(), 2),
    ];
    for t in threads {
        t.join().unwrap();
    }
}

/// Several MiB each way at once through a pinned TLS connection, with keys replaced every 50
/// records (KeyUpdate messages in both directions while both are busy), read in pieces of
/// many sizes: every byte arrives.
#[test]
fn tls_with_a_pinned_fingerprint_carries_data_both_ways_across_key_updates() {
    rgpu_transport::tls::set_key_update_interval(50);
    let identity = identity();
    let fp = identity.fingerprint().unwrap();
    let (client, server) = over_tcp(
        tls_server(&identity, Plaintext::Local),
        pinned(fp),
        "127.0.0.1",
        exchange_both_ways,
    );
    client.unwrap();
    server.unwrap();
}

#[test]
fn an_untrusted_certificate_is_refused_naming_its_fingerprint() {
    let identity = identity();
    let fp = identity.fingerprint().unwrap();
    // No pin at all: the message says which fingerprint to check and pin.
    let none = ClientSecurity {
        mode: TlsMode::On,
        ..ClientSecurity::default()
    };
    let (client, server) = over_tcp(
        tls_server(&identity, Plaintext::Local),
        none,
        "127.0.0.1",
        |_, _| {},
    );
    let err = client.unwrap_err().to_string();
    assert!(err.contains(&format!("RGPU_TLS_FINGERPRINT={fp}")), "{err}");
    assert!(server.is_err());
    // Another server's pin.
    let other = identity_fp_other();
    let (client, _) = over_tcp(
        tls_server(&identity, Plaintext::Local),
        pinned(other),
        "127.0.0.1",
        |_, _| {},
    );
    let err = client.unwrap_err().to_string();
    assert!(
        err.contains("none of those RGPU_TLS_FINGERPRINT names"),
        "{err}"
    );
    assert!(err.contains(&fp.to_string()), "{err}");
}

fn identity_fp_other() -> Fingerprint {
    identity().fingerprint().unwrap()
}

#[test]
fn plaintext_is_refused_where_the_server_wants_tls() {
    let identity = identity();
    let (client, server) = over_tcp(
        tls_server(&identity, Plaintext::Never),
        ClientSecurity::default(),
        "127.0.0.1",
        |_, _| {},
    );
    let err = client.unwrap_err().to_string();
    assert!(err.contains("accepts TLS connections only"), "{err}");
    assert!(matches!(server, Err(TransportError::Auth(_))));
    // A server with no TLS at all says so to a client that asks for it.
    let (client, _) = over_tcp(
        ServerSecurity::default(),
        pinned(identity.fingerprint().unwrap()),
        "127.0.0.1",
        |_, _| {},
    );
    let err = client.unwrap_err().to_string();
    assert!(err.contains("does not offer TLS"), "{err}");
}

/// A server certificate signed by a CA the client trusts (RGPU_TLS_CA), for the name the client
/// connects to; another name is refused.
#[test]
fn a_ca_signed_certificate_is_trusted_for_its_name() {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let server_key = rcgen::KeyPair::generate().unwrap();
    let server_cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&server_key, &issuer)
        .unwrap();
    let identity = TlsIdentity::from_pem(server_cert.pem(), server_key.serialize_pem()).unwrap();
    let ca_file = std::env::temp_dir().join(format!("rgpu-test-ca-{}.pem", std::process::id()));
    std::fs::write(&ca_file, ca_cert.pem()).unwrap();
    let trusting = ClientSecurity {
        mode: TlsMode::On,
        pins: Vec::new(),
        ca_file: Some(ca_file.clone()),
    };
    let (client, server) = over_tcp(
        tls_server(&identity, Plaintext::Local),
        trusting.clone(),
        "localhost",
        exchange_both_ways,
    );
    client.unwrap();
    server.unwrap();
    let (client, _) = over_tcp(
        tls_server(&identity, Plaintext::Local),
        trusting,
        "127.0.0.1",
        |_, _| {},
    );
    let err = client.unwrap_err().to_string();
    assert!(err.contains("TLS handshake"), "{err}");
    let _ = std::fs::remove_file(ca_file);
}
