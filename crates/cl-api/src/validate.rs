//! Checks of what a program (or a hand-crafted request) passes to the OpenCL implementation,
//! shared by the client library (which returns the error at once) and the server (which must
//! never let a request reach a native call that crashes or aborts on it: PoCL's compiler
//! segfaults on `-D` without a macro name, for example).

use crate::sys;

/// Options that take an argument, as a separate word or joined to the option.
const WITH_ARGUMENT: [&str; 2] = ["-D", "-I"];
/// Longest build options accepted (a program's options are a command line, not a file).
pub const MAX_BUILD_OPTIONS: usize = 64 * 1024;

/// Checks build, compile or link options: `CL_INVALID_BUILD_OPTIONS` for an option missing its
/// argument, a macro name that is not an identifier, or options too long to be real.
pub fn build_options(options: &str) -> Result<(), i32> {
    if options.len() > MAX_BUILD_OPTIONS || options.contains('\0') {
        return Err(sys::CL_INVALID_BUILD_OPTIONS);
    }
    let mut words = options.split_whitespace();
    while let Some(word) = words.next() {
        let Some(&option) = WITH_ARGUMENT.iter().find(|o| word.starts_with(**o)) else {
            continue;
        };
        let joined = &word[option.len()..];
        let argument = if joined.is_empty() {
            match words.next() {
                Some(next) if !next.starts_with('-') || option == "-I" => next,
                _ => return Err(sys::CL_INVALID_BUILD_OPTIONS),
            }
        } else {
            joined
        };
        if option == "-D" {
            // NAME, NAME=VALUE or a function-like NAME(ARGS)=VALUE.
            let name = argument.split(['=', '(']).next().unwrap_or_default();
            let mut chars = name.chars();
            let identifier = chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !identifier {
                return Err(sys::CL_INVALID_BUILD_OPTIONS);
            }
        }
    }
    Ok(())
}

/// Command-queue flags rgpu serves: out-of-order execution and profiling (no on-device queues).
const QUEUE_FLAGS: u64 =
    sys::CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE | sys::CL_QUEUE_PROFILING_ENABLE;
const ON_DEVICE_FLAGS: u64 = sys::CL_QUEUE_ON_DEVICE | sys::CL_QUEUE_ON_DEVICE_DEFAULT;

const QUEUE_PRIORITY_KHR: u32 = 0x1096;
const QUEUE_THROTTLE_KHR: u32 = 0x1097;

/// Checks a zero-terminated queue property list as sent to the server: known keys, known
/// flags, no on-device queue (`CL_INVALID_QUEUE_PROPERTIES`), well formed (`CL_INVALID_VALUE`).
pub fn queue_properties(properties: &[u64]) -> Result<(), i32> {
    let (pairs, rest) = properties.as_chunks::<2>();
    let terminated = match (pairs.iter().position(|p| p[0] == 0), rest) {
        (Some(_), _) => true,
        (None, [0]) => true,
        _ => properties.is_empty(),
    };
    if !terminated {
        return Err(sys::CL_INVALID_VALUE);
    }
    for &[key, value] in pairs.iter().take_while(|p| p[0] != 0) {
        match key as u32 {
            sys::CL_QUEUE_PROPERTIES => {
                if value & ON_DEVICE_FLAGS != 0 {
                    return Err(sys::CL_INVALID_QUEUE_PROPERTIES);
                }
                if value & !QUEUE_FLAGS != 0 {
                    return Err(sys::CL_INVALID_VALUE);
                }
            }
            // Only meaningful for on-device queues.
            sys::CL_QUEUE_SIZE => return Err(sys::CL_INVALID_QUEUE_PROPERTIES),
            // cl_khr_priority_hints and cl_khr_throttle_hints: plain enums the implementation
            // checks.
            QUEUE_PRIORITY_KHR | QUEUE_THROTTLE_KHR => {}
            _ => return Err(sys::CL_INVALID_VALUE),
        }
    }
    Ok(())
}

/// Image types an image descriptor may name.
const IMAGE_TYPES: [u32; 6] = [
    sys::CL_MEM_OBJECT_IMAGE1D,
    sys::CL_MEM_OBJECT_IMAGE1D_BUFFER,
    sys::CL_MEM_OBJECT_IMAGE1D_ARRAY,
    sys::CL_MEM_OBJECT_IMAGE2D,
    sys::CL_MEM_OBJECT_IMAGE2D_ARRAY,
    sys::CL_MEM_OBJECT_IMAGE3D,
];

/// Checks the parts of an image descriptor the specification fixes: a known type, mip levels
/// and samples 0 (`CL_INVALID_IMAGE_DESCRIPTOR`), a width (`CL_INVALID_IMAGE_SIZE`).
pub fn image_descriptor(
    image_type: u32,
    width: u64,
    num_mip_levels: u32,
    num_samples: u32,
) -> Result<(), i32> {
    if !IMAGE_TYPES.contains(&image_type) || num_mip_levels != 0 || num_samples != 0 {
        return Err(sys::CL_INVALID_IMAGE_DESCRIPTOR);
    }
    if width == 0 {
        return Err(sys::CL_INVALID_IMAGE_SIZE);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_options_need_their_arguments() {
        for good in [
            "",
            "-cl-fast-relaxed-math",
            "-DN=4 -D M -D _X=1 -I /tmp/x -Iinclude -w",
            "-I -weird-dir-name",
            "-cl-std=CL2.0 -DFOO",
            "-Dsq(x)=((x)*(x))",
        ] {
            assert_eq!(build_options(good), Ok(()), "{good}");
        }
        for bad in [
            "-D", "-I", "-DN -D", "-D -x", "-D 4X", "-D=3", "-Da-b", "-O2 -I",
        ] {
            assert_eq!(
                build_options(bad),
                Err(sys::CL_INVALID_BUILD_OPTIONS),
                "{bad}"
            );
        }
        assert!(build_options(&"-w ".repeat(MAX_BUILD_OPTIONS)).is_err());
        assert!(build_options("-DA\0").is_err());
    }

    #[test]
    fn queue_properties_served() {
        let props = sys::CL_QUEUE_PROPERTIES as u64;
        let ooo = sys::CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE;
        assert_eq!(queue_properties(&[]), Ok(()));
        assert_eq!(queue_properties(&[0]), Ok(()));
        assert_eq!(queue_properties(&[props, ooo, 0]), Ok(()));
        let on_device = sys::CL_QUEUE_ON_DEVICE;
        assert_eq!(
            queue_properties(&[props, ooo | on_device, 0]),
            Err(sys::CL_INVALID_QUEUE_PROPERTIES)
        );
        assert_eq!(
            queue_properties(&[sys::CL_QUEUE_SIZE as u64, 16, 0]),
            Err(sys::CL_INVALID_QUEUE_PROPERTIES)
        );
        assert_eq!(
            queue_properties(&[props, 1 << 40, 0]),
            Err(sys::CL_INVALID_VALUE)
        );
        assert_eq!(queue_properties(&[props, ooo]), Err(sys::CL_INVALID_VALUE));
        assert_eq!(queue_properties(&[12345, 1, 0]), Err(sys::CL_INVALID_VALUE));
    }

    #[test]
    fn image_descriptors() {
        let image2d = sys::CL_MEM_OBJECT_IMAGE2D;
        assert_eq!(image_descriptor(image2d, 16, 0, 0), Ok(()));
        assert_eq!(
            image_descriptor(image2d, 16, 3, 0),
            Err(sys::CL_INVALID_IMAGE_DESCRIPTOR)
        );
        assert_eq!(
            image_descriptor(image2d, 16, 0, 4),
            Err(sys::CL_INVALID_IMAGE_DESCRIPTOR)
        );
        assert_eq!(
            image_descriptor(0x1234, 16, 0, 0),
            Err(sys::CL_INVALID_IMAGE_DESCRIPTOR)
        );
        assert_eq!(
            image_descriptor(image2d, 0, 0, 0),
            Err(sys::CL_INVALID_IMAGE_SIZE)
        );
    }
}
