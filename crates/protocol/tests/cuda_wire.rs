//! Every CUDA message survives a round trip through a frame, and which requests wait for a
//! reply (and which carry bulk data) is fixed per kind.

use rgpu_protocol::cuda::*;
use rgpu_protocol::*;

fn round_trip<T>(msg: &T)
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let mut buf = Vec::new();
    encode_frame(msg, 9, 0, &mut buf).expect("encodes");
    let decoded: T = decode_body(&buf[HEADER_LEN..]).expect("decodes");
    assert_eq!(&decoded, msg);
}

/// A 3D copy's shape: 2 slices of 30 rows of 100 bytes.
const BOX: Extent = Extent {
    width: 100,
    height: 30,
    depth: 2,
};

fn attribute() -> LaunchAttribute {
    LaunchAttribute {
        id: 2,
        value: vec![1, 0, 0, 0],
    }
}

fn all_requests() -> Vec<CuRequest> {
    vec![
        CuRequest::GetInventory,
        CuRequest::CreateContext {
            id: 1,
            device: 0,
            flags: 0,
            primary: true,
        },
        CuRequest::DestroyContext { id: 1 },
        CuRequest::Synchronize { ctx: 1 },
        CuRequest::GetLimit { ctx: 1, limit: 2 },
        CuRequest::SetLimit {
            ctx: 1,
            limit: 2,
            value: 1 << 20,
        },
        CuRequest::MemGetInfo { ctx: 1 },
        CuRequest::MemAlloc { ctx: 1, size: 4096 },
        CuRequest::MemFree {
            ctx: 1,
            ptr: 0x7f00_0000_0000,
        },
        CuRequest::MemAllocAsync {
            ctx: 1,
            stream: 3,
            size: 4096,
        },
        CuRequest::MemFreeAsync {
            ctx: 1,
            stream: 3,
            ptr: 0x7f00_0000_0000,
        },
        CuRequest::MemcpyHtoD {
            ctx: 1,
            stream: 0,
            dst: 0x7f00_0000_0000,
            extent: Extent::linear(64),
            pitch: Extent::linear(64).packed(),
        },
        CuRequest::MemcpyDtoH {
            ctx: 1,
            stream: 3,
            src: 0x7f00_0000_0000,
            extent: BOX,
            pitch: Pitch {
                row: 512,
                slice_rows: 40,
            },
        },
        CuRequest::MemcpyDtoD {
            ctx: 1,
            stream: 3,
            dst: 1,
            dst_pitch: BOX.packed(),
            src: 2,
            src_pitch: Pitch {
                row: 1024,
                slice_rows: 32,
            },
            src_ctx: 2,
            extent: BOX,
        },
        CuRequest::EnablePeerAccess {
            ctx: 1,
            peer: 2,
            flags: 0,
        },
        CuRequest::DisablePeerAccess { ctx: 1, peer: 2 },
        CuRequest::Memset {
            ctx: 1,
            stream: 0,
            dst: 8,
            value: 0xdead_beef,
            element_size: 4,
            width: 16,
            height: 2,
            pitch: 128,
        },
        CuRequest::LoadImage {
            id: 4,
            ctx: 1,
            kind: ImageKind::Library,
            hash: [7; 32],
        },
        CuRequest::UnloadImage { id: 4 },
        CuRequest::GetFunction {
            id: 5,
            image: 4,
            name: "_Z6kernelPf".into(),
        },
        CuRequest::KernelGetFunction {
            id: 6,
            kernel: 5,
            ctx: 1,
        },
        CuRequest::GetGlobal {
            ctx: 1,
            image: 4,
            name: "table".into(),
        },
        CuRequest::SetFunctionAttribute {
            function: 5,
            attribute: 8,
            value: 65536,
            device: 0,
        },
        CuRequest::GetFunctionAttribute {
            function: 5,
            attribute: 4,
            device: 0,
        },
        CuRequest::SetFunctionCacheConfig {
            function: 5,
            config: 1,
        },
        CuRequest::Launch {
            ctx: 1,
            function: 5,
            stream: 3,
            grid: [1, 2, 3],
            block: [128, 1, 1],
            shared_mem: 0,
            attributes: vec![attribute()],
        },
        CuRequest::CreateStream {
            id: 3,
            ctx: 1,
            flags: 1,
            priority: -1,
        },
        CuRequest::DestroyStream { id: 3 },
        CuRequest::StreamSynchronize { ctx: 1, stream: 3 },
        CuRequest::StreamQuery { ctx: 1, stream: 0 },
        CuRequest::StreamWaitEvent {
            ctx: 1,
            stream: 3,
            event: 8,
            flags: 0,
        },
        CuRequest::CreateEvent {
            id: 8,
            ctx: 1,
            flags: 2,
        },
        CuRequest::DestroyEvent { id: 8 },
        CuRequest::RecordEvent {
            ctx: 1,
            event: 8,
            stream: 3,
            flags: 0,
        },
        CuRequest::EventSynchronize { event: 8 },
        CuRequest::EventQuery { event: 8 },
        CuRequest::EventElapsedTime { start: 8, end: 9 },
        CuRequest::Occupancy {
            ctx: 1,
            query: OccupancyQuery::MaxActiveBlocks {
                function: 5,
                block_size: 256,
                shared_mem: 0,
                flags: 0,
            },
        },
        CuRequest::Occupancy {
            ctx: 1,
            query: OccupancyQuery::AvailableDynamicSharedMem {
                function: 5,
                num_blocks: 2,
                block_size: 128,
            },
        },
        CuRequest::Occupancy {
            ctx: 1,
            query: OccupancyQuery::MaxPotentialBlockSize {
                function: 5,
                shared_mem: 0,
                block_size_limit: 0,
                flags: 0,
            },
        },
        CuRequest::Occupancy {
            ctx: 1,
            query: OccupancyQuery::MaxActiveClusters {
                function: 5,
                grid: [8, 1, 1],
                block: [128, 1, 1],
                shared_mem: 0,
                attributes: vec![attribute()],
            },
        },
        CuRequest::BeginCapture {
            ctx: 1,
            stream: 3,
            mode: 0,
        },
        CuRequest::EndCapture {
            ctx: 1,
            stream: 3,
            graph: 10,
        },
        CuRequest::GraphInstantiate {
            ctx: 1,
            graph: 10,
            exec: 11,
            flags: 0,
        },
        CuRequest::GraphLaunch {
            ctx: 1,
            exec: 11,
            stream: 3,
            upload: false,
        },
        CuRequest::GraphDestroy { graph: 10 },
        CuRequest::GraphExecDestroy { exec: 11 },
    ]
    .into_iter()
    .chain(
        vmm_ops()
            .into_iter()
            .map(|op| CuRequest::Vmm { ctx: 1, op }),
    )
    .collect()
}

fn vmm_ops() -> Vec<VmmOp> {
    let prop = MemProp {
        kind: 1,
        handle_types: 0,
        location_type: 1,
        location_id: 0,
        alloc_flags: [0; 8],
    };
    vec![
        VmmOp::Granularity {
            prop: prop.clone(),
            option: 1,
        },
        VmmOp::Reserve {
            size: 1 << 30,
            alignment: 0,
            addr: 0,
            flags: 0,
        },
        VmmOp::Create {
            handle: 12,
            size: 2 << 20,
            prop,
            flags: 0,
        },
        VmmOp::Map {
            ptr: 0x7f00_0000_0000,
            size: 2 << 20,
            offset: 0,
            handle: 12,
            flags: 0,
        },
        VmmOp::SetAccess {
            ptr: 0x7f00_0000_0000,
            size: 2 << 20,
            access: vec![MemAccess {
                location_type: 1,
                location_id: 0,
                flags: 3,
            }],
        },
        VmmOp::Unmap {
            ptr: 0x7f00_0000_0000,
            size: 2 << 20,
        },
        VmmOp::Release { handle: 12 },
        VmmOp::AddressFree {
            ptr: 0x7f00_0000_0000,
            size: 1 << 30,
        },
    ]
}

#[test]
fn every_cuda_request_round_trips() {
    for request in all_requests() {
        round_trip(&ClientMsg::Cu(request));
    }
}

#[test]
fn every_cuda_reply_round_trips() {
    let replies = vec![
        CuReply::Status(0),
        CuReply::Status(700),
        CuReply::Inventory(CuInventory {
            driver_version: 13000,
            devices: vec![CuDevice {
                name: "NVIDIA H100 80GB HBM3".into(),
                uuid: [3; 16],
                total_mem: 80 << 30,
                attributes: vec![(1, 1024), (75, 9), (76, 0)],
                pci_bus_id: "0000:1b:00.0".into(),
                peers: vec![CuPeer {
                    device: 1,
                    can_access: true,
                    attributes: vec![(1, 0), (2, 1)],
                }],
            }],
        }),
        CuReply::Value {
            status: 0,
            value: -5,
        },
        CuReply::MemInfo {
            status: 0,
            free: 1,
            total: 2,
        },
        CuReply::Pointer {
            status: 0,
            ptr: 0x7f00_0000_0000,
        },
        CuReply::Loaded {
            status: 0,
            need_image: true,
            log: String::new(),
        },
        CuReply::Function {
            status: 0,
            info: FunctionInfo {
                params: vec![(0, 8), (8, 4)],
                attributes: vec![(0, 1024), (4, 32)],
            },
        },
        CuReply::Global {
            status: 0,
            ptr: 9,
            size: 4,
        },
        CuReply::Elapsed {
            status: 0,
            milliseconds: 1.5,
        },
    ];
    for reply in replies {
        round_trip(&ServerMsg::Cu(reply));
    }
}

#[test]
fn asynchronous_requests_expect_no_reply() {
    for request in all_requests() {
        let asynchronous = matches!(
            request,
            CuRequest::CreateContext { .. }
                | CuRequest::DestroyContext { .. }
                | CuRequest::MemcpyHtoD { .. }
                | CuRequest::MemcpyDtoD { .. }
                | CuRequest::MemFreeAsync { .. }
                | CuRequest::Memset { .. }
                | CuRequest::UnloadImage { .. }
                | CuRequest::SetFunctionCacheConfig { .. }
                | CuRequest::Launch { .. }
                | CuRequest::CreateStream { .. }
                | CuRequest::DestroyStream { .. }
                | CuRequest::StreamWaitEvent { .. }
                | CuRequest::CreateEvent { .. }
                | CuRequest::DestroyEvent { .. }
                | CuRequest::RecordEvent { .. }
                | CuRequest::GraphLaunch { .. }
                | CuRequest::GraphDestroy { .. }
                | CuRequest::GraphExecDestroy { .. }
        );
        assert_eq!(request.expects_reply(), !asynchronous, "{request:?}");
        let bulk = matches!(
            request,
            CuRequest::MemcpyHtoD { .. } | CuRequest::LoadImage { .. } | CuRequest::Launch { .. }
        );
        assert_eq!(request.takes_bulk(), bulk, "{request:?}");
    }
}

#[test]
fn copy_shapes_measure_and_place_their_rows() {
    let pitch = Pitch {
        row: 128,
        slice_rows: 32,
    };
    assert_eq!(BOX.bytes(), Some(6000));
    assert!(BOX.fits(pitch));
    // The last row: slice 1, row 29.
    assert_eq!(BOX.span(pitch), Some((32 + 29) * 128 + 100));
    let offsets: Vec<u64> = BOX.row_offsets(pitch).collect();
    assert_eq!(offsets.len(), 60);
    assert_eq!(&offsets[..2], &[0, 128]);
    assert_eq!(offsets[30], 32 * 128);
    assert_eq!(BOX.span(BOX.packed()), BOX.bytes());
    assert!(BOX.is_contiguous(BOX.packed()));
    assert!(!BOX.is_contiguous(pitch));

    // Rows wider than their pitch, or slices taller than theirs, overlap.
    let narrow = Pitch {
        row: 99,
        slice_rows: 32,
    };
    let short = Pitch {
        row: 128,
        slice_rows: 29,
    };
    assert!(!BOX.fits(narrow) && !BOX.fits(short));
    // One row or one slice needs no pitch.
    assert!(Extent::linear(7).fits(Pitch {
        row: 0,
        slice_rows: 0
    }));
    assert_eq!(Extent::linear(0).span(BOX.packed()), Some(0));
    // Overflow is caught, not wrapped.
    let huge = Extent {
        width: 1 << 40,
        height: 1 << 30,
        depth: 1,
    };
    assert_eq!(huge.bytes(), None);
    assert!(!huge.fits(huge.packed()));
}
