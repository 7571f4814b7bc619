//! The KV service: range, put, delete, txn, compact, and paginated scans.
//!
//! The requests and answers are plain values that never touch the
//! transport, so batching (`batch`) and namespacing build them without a
//! client; only `service` sends them.

mod range_opts;
mod scan;
mod service;
mod types;

pub use range_opts::{SortOrder, SortTarget};
#[doc(hidden)]
pub use scan::extrapolate as extrapolate_scan_window;
pub use scan::{DEFAULT_PAGE_BYTES, PAGE_DECODE_SHARE, Page, Scan};
pub(crate) use service::KvClient;
pub(crate) use types::prefix_range;
pub use types::{
    Compare, CompareOp, Delete, DeleteResponse, KeyValue, Op, OpResponse, Put, PutResponse, Range,
    RangeResponse, Txn, TxnResponse, prefix_end,
};
