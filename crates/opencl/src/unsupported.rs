//! What an entry point rgpu does not implement does: return the API's error and say so once.

/// Logs (once per name) that the application called an entry point rgpu does not support.
pub fn report(name: &'static str) {
    if rgpu_client::first_time(name) {
        log::warn!("rgpu: {name} is not supported; returning an error");
    }
}
