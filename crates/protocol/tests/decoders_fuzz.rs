//! Every decoder of bytes from the network, fed arbitrary bytes (proptest): it returns a
//! value or an error, never panics, never allocates beyond what it was given; and whatever it
//! decodes encodes back to a frame that decodes the same. A server reads these from anyone who
//! can connect, before and after authentication.

use proptest::prelude::*;
use rgpu_protocol::cuda::{CuReply, CuRequest};
use rgpu_protocol::opencl::{ClReply, ClRequest};
use rgpu_protocol::{decode_body, ClientMsg, FrameHeader, Preamble, ServerMsg, HEADER_LEN};

fn round_trips<T>(bytes: &[u8])
where
    T: serde::Serialize + for<'a> serde::Deserialize<'a> + PartialEq + std::fmt::Debug,
{
    if let Ok(msg) = decode_body::<T>(bytes) {
        let again = postcard::to_stdvec(&msg).expect("a decoded message encodes");
        assert_eq!(decode_body::<T>(&again).expect("and decodes again"), msg);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    #[test]
    fn message_bodies(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        round_trips::<ClientMsg>(&bytes);
        round_trips::<ServerMsg>(&bytes);
        round_trips::<ClRequest>(&bytes);
        round_trips::<ClReply>(&bytes);
        round_trips::<CuRequest>(&bytes);
        round_trips::<CuReply>(&bytes);
    }

    /// Bodies that start like a real request (a valid variant tag) reach deeper into the
    /// decoders than uniformly random bytes do.
    #[test]
    fn bodies_with_a_valid_tag(tag in 0u8..4, sub in 0u8..80, rest in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut bytes = vec![tag, sub];
        bytes.extend(rest);
        round_trips::<ClientMsg>(&bytes);
    }

    #[test]
    fn frame_headers(raw in any::<[u8; HEADER_LEN]>()) {
        if let Ok(header) = FrameHeader::decode(&raw) {
            prop_assert_eq!(FrameHeader::decode(&header.encode()).unwrap(), header);
        }
    }

    #[test]
    fn preambles(raw in any::<[u8; Preamble::LEN]>()) {
        if let Ok(preamble) = Preamble::decode(&raw) {
            prop_assert_eq!(Preamble::decode(&preamble.encode()).unwrap(), preamble);
        }
    }
}
