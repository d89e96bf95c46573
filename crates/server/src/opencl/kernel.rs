//! Kernels: creation, cloning, and the arguments that travel with each launch.

use rgpu_cl_api::params::{decode_string, decode_unsigned};
use rgpu_cl_api::sys;
use rgpu_protocol::opencl::{serve, Answer, Id, KernelArg, KernelFacts, WorkGroupLimits};

use crate::opencl::handles::{ArgClass, KernelEntry};
use crate::opencl::native::{host_size, ArgValue, ClResult, Kernel};
use crate::session::Session;

const WORD: usize = std::mem::size_of::<usize>();

/// Without argument info, tells a pointer-sized value argument from one that takes an object
/// handle: only memory-object (and `__local`) arguments accept a NULL value. Leaves the
/// argument NULL, which the caller then overwrites.
fn probe_handle_arg(kernel: &Kernel, index: u32) -> ArgClass {
    // Local(n) is exactly (size n, NULL value).
    match kernel.set_arg(index, ArgValue::Local(WORD)) {
        Ok(()) => ArgClass::MemObject,
        Err(_) => ArgClass::Value { size: None },
    }
}

fn num_args(kernel: &Kernel) -> ClResult<u32> {
    Ok(decode_unsigned(&kernel.info(sys::CL_KERNEL_NUM_ARGS)?) as u32)
}

/// What each argument of `kernel` takes, as far as the implementation says.
fn classify_args(kernel: &Kernel) -> Vec<ArgClass> {
    let count = num_args(kernel).unwrap_or(0);
    (0..count)
        .map(|index| {
            let address = match kernel.arg_info(index, sys::CL_KERNEL_ARG_ADDRESS_QUALIFIER) {
                Ok(address) => address,
                Err(e) => {
                    log::trace!("no arg info: {e}");
                    return ArgClass::Unknown;
                }
            };
            let type_name = kernel
                .arg_info(index, sys::CL_KERNEL_ARG_TYPE_NAME)
                .map(|b| decode_string(&b))
                .unwrap_or_default();
            let type_qualifier = kernel
                .arg_info(index, sys::CL_KERNEL_ARG_TYPE_QUALIFIER)
                .map(|b| decode_unsigned(&b))
                .unwrap_or(0);
            match decode_unsigned(&address) as u32 {
                sys::CL_KERNEL_ARG_ADDRESS_GLOBAL | sys::CL_KERNEL_ARG_ADDRESS_CONSTANT => {
                    ArgClass::MemObject
                }
                sys::CL_KERNEL_ARG_ADDRESS_LOCAL => ArgClass::Local,
                _ if type_name.starts_with("sampler_t") => ArgClass::Sampler,
                _ if type_name.starts_with("image")
                    || type_qualifier & u64::from(sys::CL_KERNEL_ARG_TYPE_PIPE) != 0 =>
                {
                    ArgClass::MemObject
                }
                _ => ArgClass::Value {
                    size: value_size(&type_name),
                },
            }
        })
        .collect()
}

/// The size of a by-value argument from its type name (`float4`, `uint`, `char16`, ...);
/// None for structs, typedefs and types whose size the device decides (size_t, bool).
fn value_size(type_name: &str) -> Option<u32> {
    let name = type_name.trim();
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (base, lanes) = name.split_at(name.len() - digits);
    let lanes: u32 = match lanes {
        "" => 1,
        // 3-component vectors are stored as 4.
        "3" => 4,
        "2" | "4" | "8" | "16" => lanes.parse().ok()?,
        _ => return None,
    };
    let scalar = match base {
        "char" | "uchar" | "unsigned char" => 1,
        "short" | "ushort" | "unsigned short" | "half" => 2,
        "int" | "uint" | "unsigned int" | "float" => 4,
        "long" | "ulong" | "unsigned long" | "double" => 8,
        _ => return None,
    };
    Some(scalar * lanes)
}

impl serve::Kernels for Session {
    fn create_kernel(&mut self, id: Id, program: Id, name: String) -> Answer<KernelFacts> {
        self.cl.handles.kernels.check_free(id)?;
        let kernel = self
            .cl
            .handles
            .programs
            .get(program)?
            .create_kernel(&name)?;
        self.insert_kernel(id, kernel)
    }

    /// Creates every kernel of the program and keeps the first `ids.len()` (in the
    /// implementation's order) under those ids.
    fn create_kernels_in_program(
        &mut self,
        program: Id,
        ids: Vec<Id>,
    ) -> Answer<Vec<(String, KernelFacts)>> {
        for (i, &id) in ids.iter().enumerate() {
            self.cl.handles.kernels.check_free(id)?;
            if ids[..i].contains(&id) {
                return Err(sys::CL_INVALID_VALUE);
            }
        }
        let kernels = self
            .cl
            .handles
            .programs
            .get(program)?
            .create_all_kernels()?;
        // Kernels beyond `ids` are dropped (released) here.
        kernels
            .into_iter()
            .zip(ids)
            .map(|(kernel, id)| {
                let name = decode_string(&kernel.info(sys::CL_KERNEL_FUNCTION_NAME)?);
                Ok((name, self.insert_kernel(id, kernel)?))
            })
            .collect()
    }

    fn clone_kernel(&mut self, id: Id, source: Id) -> Answer<KernelFacts> {
        self.cl.handles.kernels.check_free(id)?;
        let kernel = self.cl.handles.kernels.get(source)?.kernel.clone_kernel()?;
        self.insert_kernel(id, kernel)
    }

    fn set_kernel_args(&mut self, kernel: Id, args: Vec<(u32, KernelArg)>) -> Answer<()> {
        self.apply_kernel_args(kernel, &args)
    }
}

impl Session {
    /// Keeps the kernel under `id`; returns what the client caches about it.
    fn insert_kernel(&mut self, id: Id, kernel: Kernel) -> ClResult<KernelFacts> {
        let count = num_args(&kernel)?;
        let arg_classes = classify_args(&kernel);
        let limits = self.work_group_limits(&kernel);
        self.cl.handles.kernels.insert(
            id,
            KernelEntry {
                kernel,
                arg_classes: arg_classes.clone(),
            },
        )?;
        Ok(KernelFacts {
            num_args: count,
            args: arg_classes,
            limits,
        })
    }

    /// The kernel's work-group limits on each served device of its program (the others
    /// answer CL_INVALID_DEVICE and are left out).
    fn work_group_limits(&self, kernel: &Kernel) -> Vec<WorkGroupLimits> {
        self.cl
            .inventory
            .devices
            .iter()
            .filter_map(|device| {
                // In a session moved here, only the devices the client knows (by its ids).
                let id = self.cl.client_device_id(device.id);
                if id == 0 {
                    return None;
                }
                let info = |param| kernel.work_group_info(Some(device.native), param).ok();
                let max_size = decode_unsigned(&info(sys::CL_KERNEL_WORK_GROUP_SIZE)?);
                let required = info(sys::CL_KERNEL_COMPILE_WORK_GROUP_SIZE)?;
                let mut sizes = required.chunks(WORD).map(decode_unsigned);
                Some(WorkGroupLimits {
                    device: id,
                    max_size,
                    required: [(); 3].map(|()| sizes.next().unwrap_or(0)),
                })
            })
            .collect()
    }

    /// Sets a launch's changed arguments. A value that cannot be right for the argument's type
    /// (plain bytes for a buffer, a buffer for a sampler) is refused here, because the
    /// implementation would take the bytes for an object handle.
    pub(crate) fn apply_kernel_args(
        &mut self,
        kernel: Id,
        args: &[(u32, KernelArg)],
    ) -> ClResult<()> {
        if args.is_empty() {
            return Ok(());
        }
        let handles = &mut self.cl.handles;
        let entry = handles.kernels.get_mut(kernel)?;
        let classes = &mut entry.arg_classes;
        for (index, arg) in args {
            let slot = classes.get_mut(*index as usize);
            let mut class = slot.as_deref().copied().unwrap_or(ArgClass::Unknown);
            if class == ArgClass::Unknown && matches!(arg, KernelArg::Bytes(b) if b.len() == WORD) {
                class = probe_handle_arg(&entry.kernel, *index);
                if let Some(slot) = slot {
                    *slot = class;
                }
            }
            let value = match (arg, class) {
                (KernelArg::Bytes(bytes), ArgClass::MemObject)
                    if bytes.len() == WORD && bytes.iter().all(|&b| b == 0) =>
                {
                    ArgValue::Mem(None)
                }
                (KernelArg::Bytes(_), ArgClass::MemObject | ArgClass::Sampler) => {
                    return Err(sys::CL_INVALID_ARG_VALUE)
                }
                (KernelArg::Bytes(bytes), _) => ArgValue::Bytes(bytes),
                (KernelArg::Mem(_), ArgClass::Sampler) => return Err(sys::CL_INVALID_SAMPLER),
                (KernelArg::Mem(0), _) => ArgValue::Mem(None),
                (KernelArg::Mem(id), _) => ArgValue::Mem(Some(&handles.mems.get(*id)?.mem)),
                (KernelArg::Sampler(_), ArgClass::MemObject) => {
                    return Err(sys::CL_INVALID_MEM_OBJECT)
                }
                (KernelArg::Sampler(id), _) => ArgValue::Sampler(handles.samplers.get(*id)?),
                (KernelArg::Local(size), _) => ArgValue::Local(host_size(*size)?),
            };
            entry.kernel.set_arg(*index, value)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::value_size;

    #[test]
    fn value_sizes_from_type_names() {
        assert_eq!(value_size("int"), Some(4));
        assert_eq!(value_size("float4"), Some(16));
        assert_eq!(value_size("char16"), Some(16));
        assert_eq!(value_size("double3"), Some(32));
        assert_eq!(value_size("ulong"), Some(8));
        assert_eq!(value_size("half2"), Some(4));
        assert_eq!(value_size("struct pair"), None);
        assert_eq!(value_size("size_t"), None);
        assert_eq!(value_size("float5"), None);
    }
}
