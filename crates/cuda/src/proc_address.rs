//! `cuGetProcAddress`: which exported symbol answers a (name, CUDA version, flags) query. The
//! versioned rows come from the generated `PROC_VERSIONS`; addresses from `EXPORTS`.

use rgpu_cuda_api::generated::PROC_VERSIONS;
use rgpu_cuda_api::sys::CUdriverProcAddressQueryResult;

use crate::generated_exports::EXPORTS;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`: ask for the `_ptds`/`_ptsz` variants.
const PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// The address of an exported symbol, by exact name.
pub fn export(symbol: &str) -> Option<*const ()> {
    EXPORTS
        .binary_search_by(|(name, _)| name.cmp(&symbol))
        .ok()
        .map(|i| EXPORTS[i].1 .0)
}

/// The `PROC_VERSIONS` rows of one API name (they are sorted by name).
fn rows_of(name: &str) -> &'static [(&'static str, u32, &'static str, bool)] {
    let start = PROC_VERSIONS.partition_point(|row| row.0 < name);
    let len = PROC_VERSIONS[start..].partition_point(|row| row.0 == name);
    &PROC_VERSIONS[start..start + len]
}

/// The entry point `cuGetProcAddress(symbol, version, flags)` hands out: the symbol of the
/// newest row not above `version` (per-thread rows when `flags` asks for them and the name has
/// any), or, for a name without rows, the export of that exact name.
pub fn lookup(
    symbol: &str,
    version: i32,
    flags: u64,
) -> Result<*const (), CUdriverProcAddressQueryResult> {
    let rows = rows_of(symbol);
    if rows.is_empty() {
        return export(symbol)
            .ok_or(CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    }
    // Functions without a default-stream variant ignore the per-thread flag.
    let per_thread = flags & PER_THREAD_DEFAULT_STREAM != 0 && rows.iter().any(|row| row.3);
    let best = rows
        .iter()
        .filter(|row| row.3 == per_thread && i64::from(row.1) <= i64::from(version))
        .max_by_key(|row| row.1);
    match best {
        // Every row's symbol is exported (checked by a test); a miss would be a generator bug.
        Some(row) => export(row.2)
            .ok_or(CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
        None => Err(CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(symbol: &str) -> *const () {
        export(symbol).unwrap_or_else(|| panic!("{symbol} is not exported"))
    }

    #[test]
    fn picks_the_newest_version_not_above_the_request() {
        assert_eq!(lookup("cuMemAlloc", 3020, 0), Ok(addr("cuMemAlloc_v2")));
        assert_eq!(lookup("cuMemAlloc", 13000, 0), Ok(addr("cuMemAlloc_v2")));
        assert_eq!(lookup("cuMemAlloc", 3010, 0), Ok(addr("cuMemAlloc")));
        assert_eq!(lookup("cuCtxCreate", 12050, 0), Ok(addr("cuCtxCreate_v4")));
        assert_eq!(lookup("cuCtxCreate", 11040, 0), Ok(addr("cuCtxCreate_v3")));
        assert_eq!(lookup("cuCtxCreate", 12000, 1), Ok(addr("cuCtxCreate_v3")));
    }

    #[test]
    fn per_thread_flag_selects_per_thread_variants() {
        assert_eq!(
            lookup("cuMemcpyHtoD", 12000, 2),
            Ok(addr("cuMemcpyHtoD_v2_ptds"))
        );
        assert_eq!(
            lookup("cuMemcpyHtoD", 12000, 0),
            Ok(addr("cuMemcpyHtoD_v2"))
        );
        // No stream: the flag changes nothing.
        assert_eq!(lookup("cuMemAlloc", 12000, 2), Ok(addr("cuMemAlloc_v2")));
        assert_eq!(
            lookup("cuMemcpyHtoD", 6050, 2),
            Err(CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
        );
    }

    #[test]
    fn unknown_and_too_new_names() {
        assert_eq!(
            lookup("cuNoSuchFunction", 13000, 0),
            Err(CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)
        );
        assert_eq!(
            lookup("cuCtxCreate", 1000, 0),
            Err(CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
        );
        assert_eq!(
            lookup("cuCtxCreate", -1, 0),
            Err(CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
        );
        assert_eq!(
            lookup("cuGetProcAddress", 12000, 0),
            Ok(addr("cuGetProcAddress_v2"))
        );
    }

    #[test]
    fn exports_are_sorted_and_unique() {
        for pair in EXPORTS.windows(2) {
            assert!(pair[0].0 < pair[1].0, "{} before {}", pair[0].0, pair[1].0);
        }
    }

    #[test]
    fn every_versioned_symbol_is_exported() {
        for (name, version, symbol, _) in PROC_VERSIONS {
            assert!(
                export(symbol).is_some(),
                "{name}@{version} -> {symbol} is not exported"
            );
        }
    }

    #[test]
    fn every_export_is_reachable() {
        for (symbol, entry) in EXPORTS.iter() {
            let by_row = PROC_VERSIONS
                .iter()
                .any(|(name, version, row_symbol, per_thread)| {
                    let flags = if *per_thread {
                        PER_THREAD_DEFAULT_STREAM
                    } else {
                        0
                    };
                    row_symbol == symbol && lookup(name, *version as i32, flags) == Ok(entry.0)
                });
            let by_name = lookup(symbol, 13000, 0) == Ok(entry.0);
            assert!(
                by_row || by_name,
                "{symbol} cannot be reached through cuGetProcAddress"
            );
        }
    }
}
