//! placeholder: cuGetProcAddress, cuGetProcAddress_v2, cuGetExportTable
