//! The handshake over a real socket pair: tokens, refusals and version mismatches.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::thread;

use rgpu_protocol::{LaneAttach, LaneKey, Preamble, PROTOCOL_VERSION};
use rgpu_transport::{client_handshake, server_handshake, Stream, Token, TransportError};

const KEY: LaneKey = [9; 32];

fn token(text: &str) -> Token {
    Token::new(text.as_bytes().to_vec()).unwrap()
}

/// Runs both sides; returns (client result, server result).
fn handshake(
    server_token: Option<Token>,
    client_token: Option<Token>,
) -> (Result<u64, TransportError>, Result<String, TransportError>) {
    let (a, b) = UnixStream::pair().unwrap();
    let server = thread::spawn(move || {
        let mut stream = Stream::Unix(b);
        server_handshake(
            &mut stream,
            server_token.as_ref(),
            "test-server",
            77,
            KEY,
            |lane, _| match lane {
                None => Ok(()),
                Some(_) => Err("no lanes here".into()),
            },
        )
        .map(|hello| hello.name)
    });
    let mut stream = Stream::Unix(a);
    let client = client_handshake(&mut stream, client_token.as_ref(), "test-client", None)
        .map(|w| w.session_id);
    drop(stream);
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
    let (a, mut b) = UnixStream::pair().unwrap();
    let fake_server = thread::spawn(move || {
        let mut preamble = Preamble::ours().encode();
        preamble[4..8].copy_from_slice(&(PROTOCOL_VERSION + 1).to_le_bytes());
        b.write_all(&preamble).unwrap();
        let mut theirs = [0u8; Preamble::LEN];
        let _ = b.read_exact(&mut theirs);
    });
    let mut stream = Stream::Unix(a);
    let err = client_handshake(&mut stream, None, "c", None)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("version mismatch"), "{err}");
    fake_server.join().unwrap();
}

/// A data lane joins only with the session's key: the server's admission decides, and a
/// refused lane hears why.
#[test]
fn lanes_join_only_with_the_key() {
    for (key, admitted) in [(KEY, true), ([1; 32], false)] {
        let (a, b) = UnixStream::pair().unwrap();
        let server = thread::spawn(move || {
            let mut stream = Stream::Unix(b);
            server_handshake(&mut stream, None, "s", 78, [0; 32], |lane, _| {
                let lane = lane.ok_or("expected a lane")?;
                if lane.session == 77 && lane.key == KEY && lane.index == 2 {
                    Ok(())
                } else {
                    Err("not a lane of a session here".into())
                }
            })
            .map(|hello| hello.lane)
        });
        let mut stream = Stream::Unix(a);
        let lane = LaneAttach {
            session: 77,
            key,
            index: 2,
        };
        let client = client_handshake(&mut stream, None, "c", Some(lane));
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
