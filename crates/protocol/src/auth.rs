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
