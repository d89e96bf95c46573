//! Every message survives a round trip through a frame; malformed frames are rejected.

use rgpu_protocol::opencl::*;
use rgpu_protocol::*;

fn round_trip<T>(msg: &T)
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let mut buf = Vec::new();
    encode_frame(msg, 42, 7, &mut buf).expect("encodes");
    let header = FrameHeader::decode(buf[..HEADER_LEN].try_into().unwrap()).expect("header");
    assert_eq!(header.seq, 42);
    assert_eq!(header.bulk_len, 7);
    assert_eq!(header.body_len as usize, buf.len() - HEADER_LEN);
    let decoded: T = decode_body(&buf[HEADER_LEN..]).expect("decodes");
    assert_eq!(&decoded, msg);
}

fn all_commands() -> Vec<Command> {
    let rect = BufferRect {
        buffer_origin: [1, 2, 3],
        region: [4, 5, 6],
        buffer_row_pitch: 64,
        buffer_slice_pitch: 4096,
    };
    vec![
        Command::WriteBuffer {
            buffer: 1,
            offset: 2,
            size: 3,
        },
        Command::ReadBuffer {
            buffer: 1,
            offset: 2,
            size: 3,
        },
        Command::WriteBufferRect { buffer: 1, rect },
        Command::ReadBufferRect { buffer: 1, rect },
        Command::CopyBuffer {
            src: 1,
            dst: 2,
            src_offset: 3,
            dst_offset: 4,
            size: 5,
        },
        Command::CopyBufferRect {
            src: 1,
            dst: 2,
            src_origin: [0, 1, 2],
            dst_origin: [3, 4, 5],
            region: [6, 7, 8],
            src_row_pitch: 9,
            src_slice_pitch: 10,
            dst_row_pitch: 11,
            dst_slice_pitch: 12,
        },
        Command::FillBuffer {
            buffer: 1,
            pattern: vec![1, 2, 3, 4],
            offset: 0,
            size: 64,
        },
        Command::WriteImage {
            image: 1,
            origin: [0, 0, 0],
            region: [8, 8, 1],
        },
        Command::ReadImage {
            image: 1,
            origin: [1, 1, 0],
            region: [2, 2, 1],
        },
        Command::CopyImage {
            src: 1,
            dst: 2,
            src_origin: [0; 3],
            dst_origin: [1; 3],
            region: [2; 3],
        },
        Command::FillImage {
            image: 1,
            color: [7; 16],
            origin: [0; 3],
            region: [4, 4, 1],
        },
        Command::CopyImageToBuffer {
            src: 1,
            dst: 2,
            src_origin: [0; 3],
            region: [4, 4, 1],
            dst_offset: 16,
        },
        Command::CopyBufferToImage {
            src: 1,
            dst: 2,
            src_offset: 16,
            dst_origin: [0; 3],
            region: [4, 4, 1],
        },
        Command::NdRange {
            kernel: 9,
            work_dim: 2,
            offset: Some(vec![0, 0]),
            global: vec![1024, 768],
            local: None,
            args: vec![
                (0, KernelArg::Bytes(vec![1, 2, 3, 4])),
                (1, KernelArg::Mem(5)),
                (2, KernelArg::Mem(0)),
                (3, KernelArg::Sampler(6)),
                (4, KernelArg::Local(4096)),
            ],
        },
        Command::MarkerWithWaitList,
        Command::BarrierWithWaitList,
        Command::MigrateMemObjects {
            objects: vec![1, 2],
            flags: 1,
        },
    ]
}

fn all_requests() -> Vec<ClRequest> {
    let format = ImageFormat {
        channel_order: 0x10B5,
        channel_data_type: 0x10D2,
    };
    let desc = ImageDesc {
        image_type: 0x10F1,
        width: 64,
        height: 32,
        depth: 1,
        array_size: 1,
        row_pitch: 0,
        slice_pitch: 0,
        num_mip_levels: 0,
        num_samples: 0,
        mem_object: 0,
    };
    let queries = vec![
        InfoQuery::Platform(1),
        InfoQuery::Device(1),
        InfoQuery::Context(2),
        InfoQuery::Queue(3),
        InfoQuery::Mem(4),
        InfoQuery::Image(5),
        InfoQuery::Sampler(6),
        InfoQuery::Program(7),
        InfoQuery::ProgramBuild {
            program: 7,
            device: 1,
        },
        InfoQuery::Kernel(8),
        InfoQuery::KernelWorkGroup {
            kernel: 8,
            device: 1,
        },
        InfoQuery::KernelArg {
            kernel: 8,
            index: 2,
        },
        InfoQuery::KernelSubGroup {
            kernel: 8,
            device: 1,
            input: vec![0; 8],
        },
        InfoQuery::Event(9),
        InfoQuery::EventProfiling(9),
    ];
    let mut requests: Vec<ClRequest> = queries
        .into_iter()
        .map(|query| ClRequest::GetInfo {
            query,
            param: 0x1000,
        })
        .collect();
    requests.extend([
        ClRequest::GetInventory,
        ClRequest::CreateContext {
            id: 2,
            devices: vec![1],
            properties: vec![0],
        },
        ClRequest::CreateQueue {
            id: 3,
            context: 2,
            device: 1,
            properties: vec![0x1093, 2, 0],
        },
        ClRequest::CreateBuffer {
            id: 4,
            context: 2,
            flags: 1,
            size: 1 << 20,
            properties: vec![],
        },
        ClRequest::CreateSubBuffer {
            id: 5,
            parent: 4,
            flags: 0,
            origin: 128,
            size: 256,
        },
        ClRequest::CreateImage {
            id: 6,
            context: 2,
            flags: 1,
            format,
            desc,
            properties: vec![],
        },
        ClRequest::GetSupportedImageFormats {
            context: 2,
            flags: 1,
            image_type: 0x10F1,
        },
        ClRequest::CreateSampler {
            id: 7,
            context: 2,
            properties: vec![0x1152, 1, 0],
        },
        ClRequest::CreateProgramWithSource {
            id: 8,
            context: 2,
            source: "kernel void k() {}".into(),
        },
        ClRequest::CreateProgramWithBinary {
            id: 9,
            context: 2,
            devices: vec![1],
            binaries: vec![vec![0x7f, b'E']],
        },
        ClRequest::CreateProgramWithIl {
            id: 10,
            context: 2,
            il: vec![3, 2, 0x23, 7],
        },
        ClRequest::CreateProgramWithBuiltInKernels {
            id: 11,
            context: 2,
            devices: vec![1],
            kernel_names: "a;b".into(),
        },
        ClRequest::BuildProgram {
            program: 8,
            devices: vec![],
            options: "-DX=1 -I /opt/inc".into(),
            includes: vec![IncludeDir {
                dir: "/opt/inc".into(),
                files: vec![("sub/a.h".into(), b"#define A 1\n".to_vec())],
            }],
        },
        ClRequest::CompileProgram {
            program: 8,
            devices: vec![1],
            options: String::new(),
            headers: vec![(12, "h.h".into())],
            includes: vec![],
        },
        ClRequest::LinkProgram {
            id: 13,
            context: 2,
            devices: vec![],
            options: String::new(),
            inputs: vec![8],
        },
        ClRequest::CreateKernel {
            id: 14,
            program: 8,
            name: "k".into(),
        },
        ClRequest::CreateKernelsInProgram {
            program: 8,
            ids: vec![15, 16],
        },
        ClRequest::CloneKernel { id: 17, source: 14 },
        ClRequest::SetKernelArgs {
            kernel: 14,
            args: vec![(0, KernelArg::Local(64))],
        },
        ClRequest::Release {
            kind: ObjKind::Kernel,
            id: 17,
        },
        ClRequest::CreateUserEvent { id: 18, context: 2 },
        ClRequest::SetUserEventStatus {
            event: 18,
            status: 0,
        },
        ClRequest::WaitForEvents { events: vec![18] },
        ClRequest::NotifyEvent {
            event: 18,
            status: 0,
        },
        ClRequest::Flush { queue: 3 },
        ClRequest::Finish { queue: 3 },
    ]);
    requests.extend(
        all_commands()
            .into_iter()
            .map(|command| ClRequest::Enqueue {
                queue: 3,
                wait: vec![18],
                event: 19,
                command,
            }),
    );
    requests
}

#[test]
fn every_client_message_round_trips() {
    let mut messages = vec![
        ClientMsg::Authenticate {
            client_nonce: [1; 32],
            proof: Some([2; 32]),
            client_name: "t[1]".into(),
            lane: None,
        },
        ClientMsg::Authenticate {
            client_nonce: [1; 32],
            proof: None,
            client_name: String::new(),
            lane: Some(LaneAttach {
                session: 3,
                key: [5; 32],
                index: 1,
            }),
        },
        ClientMsg::Ping,
    ];
    messages.extend(all_requests().into_iter().map(ClientMsg::Cl));
    for msg in &messages {
        round_trip(msg);
    }
}

#[test]
fn every_server_message_round_trips() {
    let inventory = Inventory {
        platforms: vec![PlatformDesc {
            id: 1,
            info: vec![(0x902, b"PoCL\0".to_vec())],
        }],
        devices: vec![DeviceDesc {
            id: 1,
            platform: 1,
            info: vec![(0x1000, 4u64.to_le_bytes().to_vec())],
        }],
    };
    let replies = vec![
        ClReply::Status(-5),
        ClReply::Info {
            status: 0,
            value: vec![1, 2, 3],
        },
        ClReply::Inventory(inventory),
        ClReply::ImageFormats {
            status: 0,
            formats: vec![ImageFormat {
                channel_order: 1,
                channel_data_type: 2,
            }],
        },
        ClReply::Binary {
            status: 0,
            binary_status: vec![0, -42],
        },
        ClReply::Kernel {
            status: 0,
            num_args: 5,
            args: vec![
                ArgKind::Unknown,
                ArgKind::MemObject,
                ArgKind::Sampler,
                ArgKind::Local,
                ArgKind::Value { size: Some(16) },
            ],
            limits: vec![WorkGroupLimits {
                device: 1,
                max_size: 256,
                required: [8, 4, 1],
            }],
        },
        ClReply::Kernels {
            status: 0,
            names: vec!["a".into()],
            num_args: vec![1],
            args: vec![vec![ArgKind::Value { size: None }]],
            limits: vec![vec![]],
        },
    ];
    let mut messages = vec![
        ServerMsg::Challenge {
            server_nonce: [3; 32],
            token_required: true,
            server_name: "gpu1".into(),
        },
        ServerMsg::Welcome {
            session_id: 7,
            server_proof: [4; 32],
            lane_key: [6; 32],
        },
        ServerMsg::Fatal {
            message: "wrong token".into(),
        },
        ServerMsg::Pong,
        ServerMsg::Data { offset: 1 << 30 },
        ServerMsg::EventStatus {
            event: 5,
            status: 0,
        },
    ];
    messages.extend(replies.into_iter().map(ServerMsg::Cl));
    for msg in &messages {
        round_trip(msg);
    }
}

#[test]
fn reply_expectations_are_fixed_per_kind() {
    assert!(ClientMsg::Ping.expects_reply());
    let read = ClRequest::Enqueue {
        queue: 1,
        wait: vec![],
        event: 0,
        command: Command::ReadBuffer {
            buffer: 1,
            offset: 0,
            size: 4,
        },
    };
    let write = ClRequest::Enqueue {
        queue: 1,
        wait: vec![],
        event: 0,
        command: Command::WriteBuffer {
            buffer: 1,
            offset: 0,
            size: 4,
        },
    };
    assert!(read.expects_reply());
    assert!(!write.expects_reply());
    assert!(!ClRequest::Release {
        kind: ObjKind::Mem,
        id: 1
    }
    .expects_reply());
    assert!(ClRequest::Finish { queue: 1 }.expects_reply());
}

fn header_bytes(body_len: u32, lanes: u32, bulk_len: u64) -> [u8; HEADER_LEN] {
    FrameHeader {
        body_len,
        lanes,
        seq: 1,
        bulk_len,
    }
    .encode()
}

#[test]
fn malformed_headers_are_rejected() {
    assert!(
        FrameHeader::decode(&header_bytes(0, 0, 0)).is_err(),
        "empty body"
    );
    assert!(
        FrameHeader::decode(&header_bytes(8, MAX_LANES + 1, 0)).is_err(),
        "more lanes than a session may have"
    );
    assert_eq!(
        FrameHeader::decode(&header_bytes(8, 4, 1 << 26)).map(|h| h.lanes),
        Ok(4),
        "bulk striped over 4 lanes"
    );
    assert!(
        FrameHeader::decode(&header_bytes(u32::MAX, 0, 0)).is_err(),
        "huge body"
    );
    assert!(
        FrameHeader::decode(&header_bytes(8, 0, u64::MAX)).is_err(),
        "huge bulk"
    );
    assert!(FrameHeader::decode(&header_bytes(8, 0, 1 << 20)).is_ok());
}

#[test]
fn malformed_bodies_are_rejected() {
    let mut buf = Vec::new();
    encode_frame(&ClientMsg::Cl(all_requests()[20].clone()), 1, 0, &mut buf).unwrap();
    let body = &buf[HEADER_LEN..];
    // Truncated at every length.
    for cut in 0..body.len() {
        assert!(
            decode_body::<ClientMsg>(&body[..cut]).is_err(),
            "truncated at {cut}"
        );
    }
    // Trailing garbage.
    let mut long = body.to_vec();
    long.push(0);
    assert!(decode_body::<ClientMsg>(&long).is_err());
    // An unknown variant tag.
    assert!(decode_body::<ClientMsg>(&[0xff, 0xff, 0x7f]).is_err());
}

#[test]
fn preamble_detects_version_and_magic() {
    let ours = Preamble::client(false, None).encode();
    assert_eq!(
        Preamble::decode(&ours).unwrap(),
        Preamble::client(false, None)
    );
    let mut other = ours;
    other[4..8].copy_from_slice(&(PROTOCOL_VERSION + 1).to_le_bytes());
    let err = Preamble::decode(&other).unwrap_err();
    assert!(err.to_string().contains("version mismatch"), "{err}");
    // An older peer's shorter preamble: its head alone tells the mismatch.
    let mut v3 = [0u8; 12];
    v3[0..4].copy_from_slice(b"RGPU");
    v3[4..8].copy_from_slice(&3u32.to_le_bytes());
    let err = Preamble::check_head(v3[..8].try_into().unwrap()).unwrap_err();
    assert!(err.to_string().contains("speaks version 3"), "{err}");
    let mut bad = ours;
    bad[0] = b'X';
    assert!(Preamble::decode(&bad).is_err());
    let mut unknown_flag = ours;
    unknown_flag[8] = 0x80;
    assert!(Preamble::decode(&unknown_flag).is_err());
}

/// The preamble's bytes are pinned: magic, version, flags (TLS = 1, refused = 2) and the
/// session a data lane joins, all little-endian.
#[test]
fn preamble_golden_bytes() {
    let lane = Preamble::client(true, Some(0x0102030405060708)).encode();
    let mut expected = Vec::new();
    expected.extend_from_slice(b"RGPU");
    expected.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    expected.extend_from_slice(&[1, 0, 0, 0]);
    expected.extend_from_slice(&[8, 7, 6, 5, 4, 3, 2, 1]);
    assert_eq!(lane.to_vec(), expected);
    assert_eq!(PROTOCOL_VERSION, 4);
    let refused = Preamble::server(Preamble::REFUSED).encode();
    assert_eq!(&refused[8..], &[2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let decoded = Preamble::decode(&lane).unwrap();
    assert!(decoded.tls() && !decoded.refused());
    assert_eq!(decoded.lane_of, Some(0x0102030405060708));
}

#[test]
fn proofs_bind_token_and_nonces() {
    let (token, s, c) = (b"a-shared-secret-token".as_slice(), [1u8; 32], [2u8; 32]);
    let proof = auth::client_proof(token, &s, &c);
    assert!(auth::verify_client(token, &s, &c, &proof));
    assert!(!auth::verify_client(
        b"another-secret-token!",
        &s,
        &c,
        &proof
    ));
    assert!(
        !auth::verify_client(token, &c, &s, &proof),
        "nonces swapped"
    );
    let server = auth::server_proof(token, &s, &c);
    assert_ne!(server, proof, "the two directions differ");
    assert!(auth::verify_server(token, &s, &c, &server));
    assert!(!auth::verify_server(token, &s, &c, &proof));
}
