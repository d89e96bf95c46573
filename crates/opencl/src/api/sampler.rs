//! Samplers. Their state is fixed at creation, so every query is answered locally.

use std::ffi::c_void;
use std::sync::Arc;

use opencl_sys::*;
use rgpu_client::OpenClClient;

use crate::api::context::context_from;
use crate::api::image::context_supports_images;
use crate::handle::{self, Ref};
use crate::objects::Sampler;
use crate::util::{bytes_of, bytes_of_slice, creation, guard, property_list, write_info, Outcome};

pub fn sampler_from(sampler: cl_sampler) -> Result<Ref<Sampler>, cl_int> {
    handle::lookup::<Sampler>(sampler)
}

fn valid_addressing(mode: u64) -> bool {
    [
        CL_ADDRESS_NONE,
        CL_ADDRESS_CLAMP_TO_EDGE,
        CL_ADDRESS_CLAMP,
        CL_ADDRESS_REPEAT,
        CL_ADDRESS_MIRRORED_REPEAT,
    ]
    .iter()
    .any(|&m| u64::from(m) == mode)
}

fn valid_filter(mode: u64) -> bool {
    mode == u64::from(CL_FILTER_NEAREST) || mode == u64::from(CL_FILTER_LINEAR)
}

/// The sampler state and any further (extension) properties, forwarded to the server as given.
struct SamplerState {
    normalized_coords: cl_bool,
    addressing_mode: cl_addressing_mode,
    filter_mode: cl_filter_mode,
    extra: Vec<u64>,
}

fn create_sampler(
    context: cl_context,
    state: Result<SamplerState, cl_int>,
    properties: Vec<cl_sampler_properties>,
) -> Result<*mut c_void, cl_int> {
    let context = context_from(context)?;
    let state = state?;
    if !context_supports_images(&context) {
        return Err(CL_INVALID_OPERATION);
    }
    let mut wire = vec![
        u64::from(CL_SAMPLER_NORMALIZED_COORDS),
        u64::from(state.normalized_coords),
        u64::from(CL_SAMPLER_ADDRESSING_MODE),
        u64::from(state.addressing_mode),
        u64::from(CL_SAMPLER_FILTER_MODE),
        u64::from(state.filter_mode),
    ];
    wire.extend_from_slice(&state.extra);
    wire.push(0);
    let conn = Arc::clone(&context.conn);
    let id = conn.new_id();
    conn.opencl()
        .create_sampler(id, context.id, wire.clone())
        .outcome()?;
    let sampler = handle::create(Sampler {
        conn,
        id,
        context,
        normalized_coords: state.normalized_coords,
        addressing_mode: state.addressing_mode,
        filter_mode: state.filter_mode,
        properties,
        wire_properties: wire,
    });
    Ok(handle::raw(&sampler))
}

pub unsafe extern "C" fn clCreateSampler(
    context: cl_context,
    normalized_coords: cl_bool,
    addressing_mode: cl_addressing_mode,
    filter_mode: cl_filter_mode,
    errcode_ret: *mut cl_int,
) -> cl_sampler {
    guard(std::ptr::null_mut(), || {
        let state = if valid_addressing(u64::from(addressing_mode))
            && valid_filter(u64::from(filter_mode))
        {
            Ok(SamplerState {
                normalized_coords: if normalized_coords != 0 {
                    CL_TRUE
                } else {
                    CL_FALSE
                },
                addressing_mode,
                filter_mode,
                extra: Vec::new(),
            })
        } else {
            Err(CL_INVALID_VALUE)
        };
        let result = create_sampler(context, state, Vec::new());
        // SAFETY: the application's errcode pointer.
        unsafe { creation(result, errcode_ret) }
    })
}

/// Parses a sampler property list: the core properties (with their defaults), and any others
/// kept for the server to judge.
fn parse_properties(list: &[cl_sampler_properties]) -> Result<SamplerState, cl_int> {
    let mut state = SamplerState {
        normalized_coords: CL_TRUE,
        addressing_mode: CL_ADDRESS_CLAMP,
        filter_mode: CL_FILTER_NEAREST,
        extra: Vec::new(),
    };
    let mut seen: Vec<u64> = Vec::new();
    for pair in list.as_chunks::<2>().0 {
        let (key, value) = (pair[0], pair[1]);
        if seen.contains(&key) {
            return Err(CL_INVALID_VALUE);
        }
        seen.push(key);
        match u32::try_from(key) {
            Ok(CL_SAMPLER_NORMALIZED_COORDS) => {
                state.normalized_coords = match value {
                    0 => CL_FALSE,
                    1 => CL_TRUE,
                    _ => return Err(CL_INVALID_VALUE),
                };
            }
            Ok(CL_SAMPLER_ADDRESSING_MODE) if valid_addressing(value) => {
                state.addressing_mode = value as u32
            }
            Ok(CL_SAMPLER_FILTER_MODE) if valid_filter(value) => state.filter_mode = value as u32,
            Ok(CL_SAMPLER_ADDRESSING_MODE | CL_SAMPLER_FILTER_MODE) => {
                return Err(CL_INVALID_VALUE)
            }
            // Extension properties (e.g. cl_khr_mipmap_image's): the device decides.
            _ => state.extra.extend_from_slice(&[key, value]),
        }
    }
    Ok(state)
}

pub unsafe extern "C" fn clCreateSamplerWithProperties(
    context: cl_context,
    sampler_properties: *const cl_sampler_properties,
    errcode_ret: *mut cl_int,
) -> cl_sampler {
    guard(std::ptr::null_mut(), || {
        // SAFETY: a zero-terminated list from the application (or null).
        let list = unsafe { property_list(sampler_properties) };
        let state = parse_properties(&list);
        let result = create_sampler(context, state, list);
        // SAFETY: the application's errcode pointer.
        unsafe { creation(result, errcode_ret) }
    })
}

pub unsafe extern "C" fn clRetainSampler(sampler: cl_sampler) -> cl_int {
    handle::retain::<Sampler>(sampler)
}

pub unsafe extern "C" fn clReleaseSampler(sampler: cl_sampler) -> cl_int {
    handle::release::<Sampler>(sampler)
}

pub unsafe extern "C" fn clGetSamplerInfo(
    sampler: cl_sampler,
    param_name: cl_sampler_info,
    param_value_size: usize,
    param_value: *mut c_void,
    param_value_size_ret: *mut usize,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let sampler = match sampler_from(sampler) {
            Ok(s) => s,
            Err(code) => return code,
        };
        let value = match param_name {
            CL_SAMPLER_REFERENCE_COUNT => bytes_of(&handle::app_refs(&sampler)),
            CL_SAMPLER_CONTEXT => bytes_of(&handle::raw(&sampler.context)),
            CL_SAMPLER_NORMALIZED_COORDS => bytes_of(&sampler.normalized_coords),
            CL_SAMPLER_ADDRESSING_MODE => bytes_of(&sampler.addressing_mode),
            CL_SAMPLER_FILTER_MODE => bytes_of(&sampler.filter_mode),
            CL_SAMPLER_PROPERTIES => bytes_of_slice(&sampler.properties),
            _ => return CL_INVALID_VALUE,
        };
        // SAFETY: the application's out-pointers for this query.
        unsafe { write_info(&value, param_value_size, param_value, param_value_size_ret) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_properties() {
        let state = parse_properties(&[]).map_err(|_| ()).unwrap();
        assert_eq!(
            (
                state.normalized_coords,
                state.addressing_mode,
                state.filter_mode
            ),
            (CL_TRUE, CL_ADDRESS_CLAMP, CL_FILTER_NEAREST)
        );
        let list = [
            u64::from(CL_SAMPLER_NORMALIZED_COORDS),
            0,
            u64::from(CL_SAMPLER_FILTER_MODE),
            u64::from(CL_FILTER_LINEAR),
            0,
        ];
        let state = parse_properties(&list).map_err(|_| ()).unwrap();
        assert_eq!(
            (state.normalized_coords, state.filter_mode),
            (CL_FALSE, CL_FILTER_LINEAR)
        );
        let twice = [
            u64::from(CL_SAMPLER_FILTER_MODE),
            u64::from(CL_FILTER_LINEAR),
            u64::from(CL_SAMPLER_FILTER_MODE),
            u64::from(CL_FILTER_LINEAR),
            0,
        ];
        assert_eq!(parse_properties(&twice).err(), Some(CL_INVALID_VALUE));
        let bad = [u64::from(CL_SAMPLER_ADDRESSING_MODE), 12345, 0];
        assert_eq!(parse_properties(&bad).err(), Some(CL_INVALID_VALUE));
    }
}
