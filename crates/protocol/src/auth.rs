//! Challenge-response authentication with a shared token: each side proves it knows the token
//! with an HMAC-SHA256 over both nonces, so the token itself never crosses the wire.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::{Nonce, Proof};

type HmacSha256 = Hmac<Sha256>;

fn mac(token: &[u8], label: &[u8], first: &Nonce, second: &Nonce) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(token).expect("HMAC accepts keys of any length");
    mac.update(label);
    mac.update(first);
    mac.update(second);
    mac
}

/// What the client sends to prove it holds `token`.
pub fn client_proof(token: &[u8], server_nonce: &Nonce, client_nonce: &Nonce) -> Proof {
    mac(token, b"rgpu client v1", server_nonce, client_nonce)
        .finalize()
        .into_bytes()
        .into()
}

/// What the server sends back to prove it holds `token` too.
pub fn server_proof(token: &[u8], server_nonce: &Nonce, client_nonce: &Nonce) -> Proof {
    mac(token, b"rgpu server v1", client_nonce, server_nonce)
        .finalize()
        .into_bytes()
        .into()
}

/// Constant-time check of a client's proof.
pub fn verify_client(
    token: &[u8],
    server_nonce: &Nonce,
    client_nonce: &Nonce,
    proof: &Proof,
) -> bool {
    mac(token, b"rgpu client v1", server_nonce, client_nonce)
        .verify_slice(proof)
        .is_ok()
}

/// Constant-time check of the server's proof.
pub fn verify_server(
    token: &[u8],
    server_nonce: &Nonce,
    client_nonce: &Nonce,
    proof: &Proof,
) -> bool {
    mac(token, b"rgpu server v1", client_nonce, server_nonce)
        .verify_slice(proof)
        .is_ok()
}

/// What a client sends, in the clear right after the preambles, to prove it holds `token`
/// before the server spends a process on its connection (the server's pre-authentication
/// `nonce`; the full challenge-response follows, inside TLS where the connection has it).
pub fn preauth_proof(token: &[u8], nonce: &Nonce) -> Proof {
    mac(token, b"rgpu preauth v1", nonce, &[0; 32])
        .finalize()
        .into_bytes()
        .into()
}

/// Constant-time check of a pre-authentication proof.
pub fn verify_preauth(token: &[u8], nonce: &Nonce, proof: &Proof) -> bool {
    mac(token, b"rgpu preauth v1", nonce, &[0; 32])
        .verify_slice(proof)
        .is_ok()
}
