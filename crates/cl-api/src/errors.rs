//! OpenCL status codes: names for logs and messages, and an error type for helpers that
//! return `Result`.

use crate::generated::ERROR_CODES;

/// The name of an OpenCL status code (`"CL_INVALID_VALUE"`), or `"CL_SUCCESS"`, or
/// `"unknown OpenCL error"` for a code no header defines.
pub fn error_name(code: i32) -> &'static str {
    if code == 0 {
        return "CL_SUCCESS";
    }
    ERROR_CODES
        .iter()
        .find(|(value, _)| *value == code)
        .map(|(_, name)| *name)
        .unwrap_or("unknown OpenCL error")
}

/// A failed OpenCL call's status code (never CL_SUCCESS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClError(pub i32);

impl ClError {
    /// `Ok(())` for CL_SUCCESS, the error otherwise.
    pub fn check(status: i32) -> Result<(), ClError> {
        if status == 0 {
            Ok(())
        } else {
            Err(ClError(status))
        }
    }
}

impl std::fmt::Display for ClError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", error_name(self.0), self.0)
    }
}

impl std::error::Error for ClError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_known_codes() {
        assert_eq!(error_name(0), "CL_SUCCESS");
        assert_eq!(error_name(-30), "CL_INVALID_VALUE");
        assert_eq!(error_name(-59), "CL_INVALID_OPERATION");
        assert_eq!(error_name(-1001), "CL_PLATFORM_NOT_FOUND_KHR");
        assert_eq!(error_name(-123456), "unknown OpenCL error");
        assert_eq!(ClError(-5).to_string(), "CL_OUT_OF_RESOURCES (-5)");
        assert_eq!(ClError::check(0), Ok(()));
    }
}
