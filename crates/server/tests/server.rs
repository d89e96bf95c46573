//! A real server on 127.0.0.1:0, driven by a raw client that speaks the wire protocol through
//! rgpu-transport. The OpenCL tests need a device (PoCL on CPU in CI); without one they say so
//! and return.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use rgpu_protocol::opencl::{
    BufferRect, ClReply, ClRequest, Command, IncludeDir, InfoQuery, KernelArg, ObjKind, Transfer,
};
use rgpu_protocol::ServerMsg;
use rgpu_transport::{client_handshake, FrameReader, Stream, Token};

#[test]
fn inventory_write_and_read_back_10_mib() {
    let server = Running::start(None);
    let mut client = Client::connect(&server.endpoint, None).unwrap();
    client.ping();
    let Some(device) = client.setup() else { return };

    let inventory = client.inventory();
    let desc = &inventory.devices[0];
    let name = desc
        .info
        .iter()
        .find(|(param, _)| *param == CL_DEVICE_NAME)
        .expect("the inventory has the device name");
    assert!(name.1.len() > 1);
    assert!(desc.info.len() > 50, "every known parameter is queried");
    assert!(!inventory.platforms[0].info.is_empty());

    const SIZE: usize = 10 << 20;
    let data = pattern(SIZE, 1);
    assert_eq!(client.create_buffer(1, SIZE as u64, &[]), CL_SUCCESS);
    let (back, status) = client.write_then_read_back(1, &data);
    assert_eq!(status, CL_SUCCESS);
    assert!(back == data, "read-back data differs");
    assert_eq!(client.finish(), CL_SUCCESS);

    // The write's event is known and complete.
    match client.call(ClRequest::GetInfo {
        query: InfoQuery::Event(7),
        param: CL_EVENT_COMMAND_EXECUTION_STATUS,
    }) {
        ClReply::GetInfo(Ok(value)) => {
            assert_eq!(
                i32::from_le_bytes(value[..4].try_into().unwrap()),
                CL_COMPLETE
            );
        }
        other => panic!("{other:?}"),
    }
    // Handle-valued info comes back as ids.
    match client.call(ClRequest::GetInfo {
        query: InfoQuery::Context(1),
        param: CL_CONTEXT_DEVICES,
    }) {
        ClReply::GetInfo(Ok(value)) => {
            assert_eq!(value, device.to_le_bytes().to_vec());
        }
        other => panic!("{other:?}"),
    }

    // A partial read at an offset, and a buffer created with initial contents.
    let (part, status) = client.read(
        1,
        Transfer::Buffer {
            buffer: 1,
            offset: 12345,
            size: 1000,
        },
        1000,
    );
    assert_eq!(status, CL_SUCCESS);
    assert_eq!(part, data[12345..13345]);
    let small = pattern(4096, 2);
    assert_eq!(client.create_buffer(2, 4096, &small), CL_SUCCESS);
    let (back, status) = client.read(
        1,
        Transfer::Buffer {
            buffer: 2,
            offset: 0,
            size: 4096,
        },
        4096,
    );
    assert_eq!((status, back), (CL_SUCCESS, small));
    drop(client);
    assert!(server.stop() < Duration::from_secs(5));
}

#[test]
fn rect_transfers_are_packed_tightly() {
    let server = Running::start(None);
    let mut client = Client::connect(&server.endpoint, None).unwrap();
    if client.setup().is_none() {
        return;
    }
    // A 64 x 48 byte buffer; a 10 x 5 region at (3, 4).
    let full = pattern(64 * 48, 3);
    assert_eq!(
        client.create_buffer(1, full.len() as u64, &full),
        CL_SUCCESS
    );
    let rect = BufferRect {
        buffer_origin: [3, 4, 0],
        region: [10, 5, 1],
        buffer_row_pitch: 64,
        buffer_slice_pitch: 0,
    };
    let (region, status) = client.read(1, Transfer::BufferRect { buffer: 1, rect }, 50);
    assert_eq!(status, CL_SUCCESS);
    for row in 0..5 {
        let start = (4 + row) * 64 + 3;
        assert_eq!(region[row * 10..row * 10 + 10], full[start..start + 10]);
    }
    let fresh = pattern(50, 4);
    client.write(vec![], 0, Transfer::BufferRect { buffer: 1, rect }, &fresh);
    let (back, status) = client.read(1, Transfer::BufferRect { buffer: 1, rect }, 50);
    assert_eq!((status, back), (CL_SUCCESS, fresh));
}

#[test]
fn kernel_launch_with_args() {
    let server = Running::start(None);
    let mut client = Client::connect(&server.endpoint, None).unwrap();
    let Some(device) = client.setup() else { return };
    // The header comes with the build request: its -I directory exists only on the client.
    let source = "#include \"scale.h\"\n__kernel void scale(__global float *x, float k) { \
                  size_t i = get_global_id(0); x[i] = SCALE(x[i], k); }";
    assert_eq!(
        client.status(ClRequest::CreateProgramWithSource {
            id: 1,
            context: 1,
            source: source.into(),
        }),
        CL_SUCCESS
    );
    assert_eq!(
        client.status(ClRequest::BuildProgram {
            program: 1,
            devices: vec![device],
            options: "-I /client/only/include".into(),
            includes: vec![IncludeDir {
                dir: "/client/only/include".into(),
                files: vec![(
                    "scale.h".into(),
                    b"#define SCALE(x, k) ((x) * (k))\n".to_vec()
                )],
            }],
        }),
        CL_SUCCESS
    );
    match client.call(ClRequest::CreateKernel {
        id: 1,
        program: 1,
        name: "scale".into(),
    }) {
        ClReply::CreateKernel(Ok(facts)) => assert_eq!(facts.num_args, 2),
        other => panic!("{other:?}"),
    }
    let values: Vec<f32> = (0..1024).map(|i| i as f32).collect();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(
        client.create_buffer(1, bytes.len() as u64, &bytes),
        CL_SUCCESS
    );
    // Plain bytes where a buffer goes would be taken for a handle: refused, reported later.
    client.enqueue(
        vec![],
        0,
        Command::NdRange {
            kernel: 1,
            work_dim: 1,
            offset: None,
            global: vec![1024],
            local: None,
            args: vec![(0, KernelArg::Bytes(vec![1; 8]))],
        },
        &[],
    );
    assert_ne!(client.finish(), CL_SUCCESS);
    client.enqueue(
        vec![],
        5,
        Command::NdRange {
            kernel: 1,
            work_dim: 1,
            offset: None,
            global: vec![1024],
            local: None,
            args: vec![
                (0, KernelArg::Mem(1)),
                (1, KernelArg::Bytes(2.5f32.to_le_bytes().to_vec())),
            ],
        },
        &[],
    );
    let (back, status) = client.read(
        1,
        Transfer::Buffer {
            buffer: 1,
            offset: 0,
            size: bytes.len() as u64,
        },
        bytes.len(),
    );
    assert_eq!(status, CL_SUCCESS);
    let got: Vec<f32> = back
        .as_chunks::<4>()
        .0
        .iter()
        .map(|&c| f32::from_le_bytes(c))
        .collect();
    assert!(got.iter().zip(&values).all(|(g, v)| *g == v * 2.5));
    assert_eq!(
        client.status(ClRequest::WaitForEvents { events: vec![5] }),
        CL_SUCCESS
    );
    client.send(
        ClRequest::Release {
            kind: ObjKind::Kernel,
            id: 1,
        },
        &[],
    );
    match client.call(ClRequest::CreateKernelsInProgram {
        program: 1,
        ids: vec![2],
    }) {
        ClReply::CreateKernelsInProgram(Ok(kernels)) => {
            let named: Vec<(&str, u32)> = kernels
                .iter()
                .map(|(name, facts)| (name.as_str(), facts.num_args))
                .collect();
            assert_eq!(named, [("scale", 2)]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn unknown_ids_are_errors_and_fire_and_forget_errors_are_deferred() {
    let server = Running::start(None);
    let mut client = Client::connect(&server.endpoint, None).unwrap();
    assert_eq!(
        client.status(ClRequest::CreateQueue {
            id: 1,
            context: 99,
            device: 1,
            properties: vec![],
        }),
        if client.inventory().devices.is_empty() {
            -33
        } else {
            CL_INVALID_CONTEXT
        }
    );
    assert_eq!(
        client.status(ClRequest::Finish { queue: 5 }),
        CL_INVALID_COMMAND_QUEUE
    );
    assert_eq!(
        client.status(ClRequest::WaitForEvents { events: vec![3] }),
        CL_INVALID_EVENT
    );
    match client.call(ClRequest::CreateKernel {
        id: 1,
        program: 4,
        name: "k".into(),
    }) {
        ClReply::CreateKernel(answer) => assert_eq!(answer.err(), Some(-44)),
        other => panic!("{other:?}"),
    }
    if client.setup().is_none() {
        return;
    }
    // A client id that is taken.
    assert_eq!(
        client.status(ClRequest::CreateContext {
            id: 1,
            devices: vec![1],
            properties: vec![],
        }),
        CL_INVALID_VALUE
    );
    // A write to an unknown buffer: its bulk is skipped, the error waits for the Finish, and
    // its event stands failed.
    client.write(
        vec![],
        9,
        Transfer::Buffer {
            buffer: 42,
            offset: 0,
            size: 16,
        },
        &[0u8; 16],
    );
    client.enqueue(vec![], 0, Command::MarkerWithWaitList, &[]);
    assert_eq!(client.finish(), CL_INVALID_MEM_OBJECT);
    assert_eq!(
        client.finish(),
        CL_SUCCESS,
        "a deferred error is reported once"
    );
    assert!(client.status(ClRequest::WaitForEvents { events: vec![9] }) < 0);
    // A launch of an unknown kernel.
    client.enqueue(
        vec![],
        0,
        Command::NdRange {
            kernel: 77,
            work_dim: 1,
            offset: None,
            global: vec![1],
            local: None,
            args: vec![],
        },
        &[],
    );
    assert_eq!(client.finish(), CL_INVALID_KERNEL);
    // Absurd sizes are refused without the server planning or allocating for them.
    assert_eq!(client.create_buffer(1, 4096, &[]), CL_SUCCESS);
    let (_, status) = client.read(
        1,
        Transfer::Buffer {
            buffer: 1,
            offset: 0,
            size: 1 << 62,
        },
        0,
    );
    assert_eq!(status, CL_INVALID_VALUE);
    let rect = BufferRect {
        buffer_origin: [0, 0, 0],
        region: [1 << 40, 1 << 20, 1],
        buffer_row_pitch: 0,
        buffer_slice_pitch: 0,
    };
    let (_, status) = client.read(1, Transfer::BufferRect { buffer: 1, rect }, 0);
    assert_eq!(status, CL_INVALID_VALUE);
    client.ping();
}

#[test]
fn wait_on_a_user_event_does_not_block_the_session() {
    let server = Running::start(None);
    let mut client = Client::connect(&server.endpoint, None).unwrap();
    if client.setup().is_none() {
        return;
    }
    client.send(ClRequest::CreateUserEvent { id: 1, context: 1 }, &[]);
    client.send(
        ClRequest::NotifyEvent {
            event: 1,
            status: CL_COMPLETE,
        },
        &[],
    );
    let wait = client.send(ClRequest::WaitForEvents { events: vec![1] }, &[]);
    client.ping();
    client.send(
        ClRequest::SetUserEventStatus {
            event: 1,
            status: CL_COMPLETE,
        },
        &[],
    );
    // The notification and the wait's reply, in either order.
    let mut replied = false;
    let mut notified = false;
    while !(replied && notified) {
        let (header, msg) = client.reader.read_message::<ServerMsg>().unwrap();
        match msg {
            ServerMsg::EventStatus { event, status } => {
                assert_eq!((event, status), (1, CL_COMPLETE));
                notified = true;
            }
            ServerMsg::Cl(reply) => {
                assert_eq!((header.seq, status_of(reply)), (wait, CL_SUCCESS));
                replied = true;
            }
            // The session's sign of life while the wait lasts over a second.
            ServerMsg::Working | ServerMsg::Heartbeat => {}
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_malformed_frame_ends_only_its_session() {
    let server = Running::start(None);
    let mut good = Client::connect(&server.endpoint, None).unwrap();
    let has_device = good.setup().is_some();
    if has_device {
        assert_eq!(
            good.create_buffer(1, 1 << 20, &pattern(1 << 20, 5)),
            CL_SUCCESS
        );
    }

    // Garbage after a valid handshake.
    let bad = Client::connect(&server.endpoint, None).unwrap();
    let mut raw = bad.stream.try_clone().unwrap();
    raw.write_all(&[0xff; 64]).unwrap();
    let mut reader = bad.reader;
    assert!(
        reader.read_frame().is_err(),
        "the server closed the bad session"
    );

    // A truncated write: the client dies mid-transfer.
    let mut dying = Client::connect(&server.endpoint, None).unwrap();
    if has_device {
        dying.setup();
        dying.create_buffer(1, 8 << 20, &[]);
    }
    dying.send_header(
        ClRequest::EnqueueWrite {
            queue: 1,
            wait: vec![],
            event: 0,
            transfer: Transfer::Buffer {
                buffer: 1,
                offset: 0,
                size: 8 << 20,
            },
        },
        8 << 20,
    );
    dying.stream.write_all(&[1u8; 100_000]).unwrap();
    drop(dying);

    // A body that does not decode.
    let stream = Stream::connect(&server.endpoint, Duration::from_secs(5)).unwrap();
    let plain = rgpu_transport::TlsConnector::new(&Default::default()).unwrap();
    let (mut stream, _) =
        client_handshake(stream, &plain, &server.endpoint, None, "garbage", None).unwrap();
    let header = rgpu_protocol::FrameHeader {
        body_len: 3,
        lanes: 0,
        seq: 1,
        bulk_len: 0,
    };
    stream.write_all(&header.encode()).unwrap();
    stream.write_all(&[0xee, 0xee, 0xee]).unwrap();
    let mut reader = FrameReader::new(stream);
    assert!(reader.read_frame().is_err());

    good.ping();
    if has_device {
        let (data, status) = good.read(
            1,
            Transfer::Buffer {
                buffer: 1,
                offset: 0,
                size: 1 << 20,
            },
            1 << 20,
        );
        assert_eq!((status, data), (CL_SUCCESS, pattern(1 << 20, 5)));
    }
}

/// A session over TLS 1.3 (the certificate pinned; plaintext refused even on loopback):
/// requests, replies and 10 MiB of bulk each way.
#[test]
fn tls_sessions_carry_requests_and_bulk() {
    use rgpu_transport::{ClientSecurity, Plaintext, TlsConnector, TlsIdentity, TlsMode};
    let identity = TlsIdentity::generate(&["localhost".into()]).unwrap();
    let fingerprint = identity.fingerprint().unwrap();
    let server = Running::start_with(
        rgpu_server::SessionSettings {
            tls: Some(identity),
            plaintext: Plaintext::Never,
            ..Default::default()
        },
        rgpu_transport::Endpoint::Tcp("127.0.0.1:0".into()),
    );
    let refused = Client::connect(&server.endpoint, None).err().unwrap();
    assert!(
        refused.contains("accepts TLS connections only"),
        "{refused}"
    );
    let tls = TlsConnector::new(&ClientSecurity {
        mode: TlsMode::On,
        pins: vec![fingerprint],
        ca_file: None,
    })
    .unwrap();
    let mut client = Client::connect_with(&server.endpoint, None, &tls).unwrap();
    assert!(
        matches!(client.stream, Stream::Tls(_)),
        "{:?}",
        client.stream
    );
    client.ping();
    if client.setup().is_none() {
        return;
    }
    const SIZE: usize = 10 << 20;
    let data = pattern(SIZE, 3);
    assert_eq!(client.create_buffer(1, SIZE as u64, &[]), CL_SUCCESS);
    let (back, status) = client.write_then_read_back(1, &data);
    assert_eq!(status, CL_SUCCESS);
    assert!(back == data, "read-back data differs");
    assert_eq!(client.finish(), CL_SUCCESS);
}

#[test]
fn a_wrong_token_is_refused() {
    let token = Token::new(b"a-very-secret-token-123".to_vec()).unwrap();
    let wrong = Token::new(b"not-the-right-token-456".to_vec()).unwrap();
    let server = Running::start(Some(token.clone()));
    let err = Client::connect(&server.endpoint, Some(&wrong))
        .err()
        .unwrap();
    assert!(err.contains("token"), "{err}");
    assert!(Client::connect(&server.endpoint, None).is_err());
    let mut client = Client::connect(&server.endpoint, Some(&token)).unwrap();
    client.ping();
}

#[test]
fn shutdown_ends_live_sessions_promptly() {
    let server = Running::start(None);
    let mut client = Client::connect(&server.endpoint, None).unwrap();
    client.setup();
    client.ping();
    // A connection that never finishes its handshake.
    let _idle = TcpStream::connect(server.endpoint.to_string()).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let took = server.stop();
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
    assert!(
        client.reader.read_frame().is_err(),
        "the session was closed"
    );
}

#[test]
fn images_round_trip_in_row_chunks() {
    use rgpu_protocol::opencl::{ImageDesc, ImageFormat};
    const CL_RGBA: u32 = 0x10B5;
    const CL_UNORM_INT8: u32 = 0x10D2;
    const CL_MEM_OBJECT_IMAGE2D: u32 = 0x10F1;
    const CL_DEVICE_IMAGE_SUPPORT: u32 = 0x1016;
    let server = Running::start(None);
    let mut client = Client::connect(&server.endpoint, None).unwrap();
    if client.setup().is_none() {
        return;
    }
    let inventory = client.inventory();
    let image_support = inventory.devices[0]
        .info
        .iter()
        .find(|(p, _)| *p == CL_DEVICE_IMAGE_SUPPORT)
        .is_some_and(|(_, v)| v.iter().any(|&b| b != 0));
    if !image_support {
        eprintln!("device without image support; skipping");
        return;
    }
    // 1100 rows of 1024 RGBA8 pixels: 4.4 MiB, more than one staging chunk.
    let (width, height) = (1024u64, 1100u64);
    let size = (width * height * 4) as usize;
    let initial = pattern(size, 6);
    let format = ImageFormat {
        channel_order: CL_RGBA,
        channel_data_type: CL_UNORM_INT8,
    };
    let desc = ImageDesc {
        image_type: CL_MEM_OBJECT_IMAGE2D,
        width,
        height,
        depth: 0,
        array_size: 0,
        row_pitch: 0,
        slice_pitch: 0,
        num_mip_levels: 0,
        num_samples: 0,
        mem_object: 0,
    };
    let seq = client.send(
        ClRequest::CreateImage {
            id: 1,
            context: 1,
            flags: CL_MEM_READ_WRITE,
            format,
            desc,
            properties: vec![],
        },
        &initial,
    );
    assert_eq!(status_of(client.reply(seq)), CL_SUCCESS);
    let whole = Transfer::Image {
        image: 1,
        origin: [0, 0, 0],
        region: [width, height, 1],
    };
    let (back, status) = client.read(1, whole.clone(), size);
    assert_eq!(status, CL_SUCCESS);
    assert!(back == initial, "image contents differ");

    let fresh = pattern(size, 7);
    client.write(
        vec![],
        0,
        Transfer::Image {
            image: 1,
            origin: [0, 0, 0],
            region: [width, height, 1],
        },
        &fresh,
    );
    let (back, status) = client.read(1, whole, size);
    assert_eq!(status, CL_SUCCESS);
    assert!(back == fresh, "written image differs");

    // A small region, packed tightly.
    let (region, status) = client.read(
        1,
        Transfer::Image {
            image: 1,
            origin: [2, 4, 0],
            region: [5, 3, 1],
        },
        60,
    );
    assert_eq!(status, CL_SUCCESS);
    for row in 0..3 {
        let start = ((4 + row) * width as usize + 2) * 4;
        assert_eq!(region[row * 20..row * 20 + 20], fresh[start..start + 20]);
    }
    // Initial contents of the wrong size are refused without ending the session.
    let seq = client.send(
        ClRequest::CreateImage {
            id: 2,
            context: 1,
            flags: CL_MEM_READ_WRITE,
            format,
            desc,
            properties: vec![],
        },
        &[0u8; 100],
    );
    assert!(status_of(client.reply(seq)) < 0);
    client.ping();
}

#[test]
fn serves_over_a_unix_socket() {
    let path = std::env::temp_dir().join(format!("rgpu-server-test-{}.sock", std::process::id()));
    let server = Running::start_on(rgpu_transport::Endpoint::Unix(path.clone()), None);
    let mut client = Client::connect(&server.endpoint, None).unwrap();
    client.ping();
    client.inventory();
    drop(client);
    server.stop();
    assert!(!path.exists(), "the socket file is removed at shutdown");
}

/// Requests no client library would send, whose arguments crash or abort PoCL when they reach
/// it (`-D` without a name segfaults its compiler; mip-mapped images and on-device queues
/// abort it): the server refuses them with the API's errors before any native call, and the
/// session goes on. Sessions run on threads here, so a native crash would end the test.
#[test]
fn hand_crafted_requests_that_crash_pocl_get_the_apis_errors() {
    use rgpu_protocol::opencl::{ImageDesc, ImageFormat};
    const CL_INVALID_BUILD_OPTIONS: i32 = -43;
    const CL_INVALID_IMAGE_DESCRIPTOR: i32 = -65;
    const CL_INVALID_QUEUE_PROPERTIES: i32 = -35;
    const CL_QUEUE_PROPERTIES: u64 = 0x1093;
    const CL_QUEUE_ON_DEVICE: u64 = 1 << 2;
    const CL_QUEUE_SIZE: u64 = 0x1094;
    let server = Running::start(None);
    let mut client = Client::connect(&server.endpoint, None).unwrap();
    let Some(device) = client.setup() else { return };
    assert_eq!(
        client.status(ClRequest::CreateProgramWithSource {
            id: 1,
            context: 1,
            source: "__kernel void k(__global int *x) { x[0] = 1; }".into(),
        }),
        CL_SUCCESS
    );
    for options in ["-D", "-I", "-DX -D", "-D -x"] {
        let status = client.status(ClRequest::BuildProgram {
            program: 1,
            devices: vec![device],
            options: options.into(),
            includes: vec![],
        });
        assert_eq!(status, CL_INVALID_BUILD_OPTIONS, "{options}");
    }
    let seq = client.send(
        ClRequest::CreateImage {
            id: 5,
            context: 1,
            flags: CL_MEM_READ_WRITE,
            format: ImageFormat {
                channel_order: 0x10B5,     // CL_RGBA
                channel_data_type: 0x10D2, // CL_UNORM_INT8
            },
            desc: ImageDesc {
                image_type: 0x10F1, // CL_MEM_OBJECT_IMAGE2D
                width: 64,
                height: 64,
                depth: 0,
                array_size: 0,
                row_pitch: 0,
                slice_pitch: 0,
                num_mip_levels: 4,
                num_samples: 0,
                mem_object: 0,
            },
            properties: vec![],
        },
        &[],
    );
    assert_eq!(status_of(client.reply(seq)), CL_INVALID_IMAGE_DESCRIPTOR);
    for properties in [
        vec![CL_QUEUE_PROPERTIES, CL_QUEUE_ON_DEVICE, 0],
        vec![CL_QUEUE_SIZE, 1 << 20, 0],
    ] {
        let status = client.status(ClRequest::CreateQueue {
            id: 9,
            context: 1,
            device,
            properties,
        });
        assert_eq!(status, CL_INVALID_QUEUE_PROPERTIES);
    }
    // The session carries on: the program builds with good options.
    let status = client.status(ClRequest::BuildProgram {
        program: 1,
        devices: vec![device],
        options: "-DN=4".into(),
        includes: vec![],
    });
    assert_eq!(status, CL_SUCCESS);
    drop(client);
    server.stop();
}
