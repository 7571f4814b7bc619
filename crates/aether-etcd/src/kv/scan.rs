//! Paginated scans at one revision.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;

use crate::error::{Error, Result};
use crate::transport::DEFAULT_MAX_DECODING_MESSAGE_SIZE;

use super::service::KvClient;
use super::types::{KeyValue, Range, RangeResponse, prefix_end};

/// Where a scan's pages are read: a client's connection, or any range call
/// ([`Scan::with_range`]).
enum Reader {
    Kv(KvClient),
    Range {
        range: Arc<dyn Fn(Range) -> BoxFuture<'static, Result<RangeResponse>> + Send + Sync>,
    },
}

impl Reader {
    async fn range(&self, req: Range) -> Result<RangeResponse> {
        match self {
            Reader::Kv(kv) => kv.range(req).await,
            Reader::Range { range } => range(req).await,
        }
    }

    fn max_decoding(&self) -> usize {
        match self {
            Reader::Kv(kv) => kv.max_decoding(),
            Reader::Range { .. } => DEFAULT_MAX_DECODING_MESSAGE_SIZE,
        }
    }
}

/// A paginated scan at a fixed revision; see
/// [`Client::scan`](crate::Client::scan).
///
/// etcd 3.4 answers a range with a limit only after walking the index over
/// the whole rest of the range, so plain pagination costs O(n²/page): a
/// million keys in pages of 2000 take minutes. The scan therefore bounds each
/// request to a *window* whose end it extrapolates from the density of the
/// keys it has seen, aiming at one page per window, and widens the window
/// when it comes back short. Each request then costs about one page, and the
/// pages still tile the range in key order at one revision.
///
/// **Pages are bounded by bytes as well as keys.** A page's response must
/// fit the client's decode limit (`ClientConfig::max_decoding_message_size`):
/// 10,000 values of 30 KiB are over the default 256 MiB. etcd limits a range
/// by count only, so the scan turns its byte budget ([`DEFAULT_PAGE_BYTES`],
/// [`Scan::with_page_bytes`]) into a key limit from the bytes per key it has
/// read so far (the larger of the scan's average and the last page's), and
/// asks for the lesser of that and the ramp's limit (at most `page_size`).
/// The windows still aim at the ramp's count, as without a byte budget: a
/// page cut short by bytes widens the next window by as much, so the
/// windows keep spanning about a count page of key space (what etcd 3.4
/// walks per request, as before) instead of shrinking to the byte-bounded
/// page and crossing sparse stretches of the key space in many small
/// windows. A window then holds more keys than the limit and is read in
/// several requests. A response refused as too large anyway (the first
/// page, before any estimate, or values much larger than those read so
/// far) is asked again at half the limit, down to one key; only one key
/// over the decode limit fails the scan, with
/// [`Error::ResponseTooLarge`](crate::Error::ResponseTooLarge).
pub struct Scan {
    kv: Reader,
    next: Option<Bytes>,
    end: Bytes,
    page_size: i64,
    /// The count limit of the next request: ramps up to `page_size`.
    limit: i64,
    /// The byte budget of a page.
    page_bytes: usize,
    /// The key limit the byte budget allows, from the bytes per key seen so
    /// far (`i64::MAX` until a page has been read); halved when a response
    /// is refused as too large.
    byte_limit: i64,
    /// Keys and their encoded bytes read so far, for the estimate.
    seen_keys: u64,
    seen_bytes: u64,
    /// Requests asked again with fewer keys after a "too large" refusal.
    refusals: u64,
    revision: i64,
    /// Where the next window ends: extrapolated from `(a, b)` by `factor`
    /// times their distance beyond `b`. None: to the end of the range.
    hint: Option<(Bytes, Bytes, f64)>,
    /// Windows in a row that came back empty: each grows the next one by
    /// another factor of [`EMPTY_GROWTH`].
    empty_windows: u32,
    started: bool,
}

impl std::fmt::Debug for Scan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scan")
            .field("next", &self.next)
            .field("end", &self.end)
            .field("page_size", &self.page_size)
            .finish_non_exhaustive()
    }
}

/// How much more an empty window grows the next one than the last empty
/// window did: a byte's worth, so the k-th empty window in a row reaches
/// about k bytes further up the key than the one before. A window
/// extrapolated from a small page spans little key space; growing by 8
/// each time, crossing a sparse stretch (from one service's keys to the
/// next, tens of bytes up the key) took a request per ~3 bits of key:
/// ~1,000 requests to scan 300 keys of a registry in pages of 12.
const EMPTY_GROWTH: f64 = 256.0;

/// Default byte budget of a scan's page (see [`Scan`]), in encoded bytes of
/// the response. 16 MiB leaves the usual page (10,000 registry entries of a
/// few hundred bytes, 2–3 MiB) untouched, is two HTTP/2 stream windows
/// (`DEFAULT_STREAM_WINDOW`) so a page still arrives at full speed, and
/// bounds what a consumer holds: the mirror's sync keeps about four pages
/// per peer, at most 64 MiB. The budget is also never more than a quarter
/// of the client's decode limit ([`PAGE_DECODE_SHARE`]).
pub const DEFAULT_PAGE_BYTES: usize = 16 * 1024 * 1024;

/// A page aims at no more than 1/`PAGE_DECODE_SHARE` of the client's decode
/// limit. Its key limit comes from an average size per key, so the page
/// read can be larger than its budget when its entries are larger than
/// those read before; a factor of 4 absorbs that before a response is
/// refused and asked again for fewer keys.
pub const PAGE_DECODE_SHARE: usize = 4;

/// One page of a [`Scan`].
#[derive(Debug)]
#[non_exhaustive]
pub struct Page {
    /// The revision the whole scan reads at.
    pub revision: i64,
    /// The keys of this page, in key order.
    pub kvs: Vec<KeyValue>,
}

impl Scan {
    /// `[from, to)` in pages of `page_size` keys at `revision` (0: the
    /// revision of the first page).
    pub(crate) fn new(
        kv: KvClient,
        from: Bytes,
        end: Bytes,
        page_size: usize,
        revision: i64,
    ) -> Scan {
        Scan::reading(Reader::Kv(kv), from, end, page_size, revision)
    }

    /// A scan of `[from, end)` like [`Client::scan`](crate::Client::scan)'s,
    /// whose reads are calls of `range` instead of a client's own: for a
    /// layer in front of a client (a cache, a fault injector in a test) or
    /// an in-memory store that answers ranges as etcd does. Pages are
    /// bounded by bytes as for a client with the default decode limit.
    pub fn with_range<F, Fut>(
        range: F,
        from: impl Into<Bytes>,
        end: impl Into<Bytes>,
        page_size: usize,
        revision: i64,
    ) -> Scan
    where
        F: Fn(Range) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<RangeResponse>> + Send + 'static,
    {
        let range = Arc::new(move |req| Box::pin(range(req)) as BoxFuture<'static, _>);
        Scan::reading(
            Reader::Range { range },
            from.into(),
            end.into(),
            page_size,
            revision,
        )
    }

    fn reading(kv: Reader, from: Bytes, end: Bytes, page_size: usize, revision: i64) -> Scan {
        Scan {
            next: Some(from),
            end,
            page_size: page_size.max(1) as i64,
            limit: page_size.max(1) as i64,
            page_bytes: (kv.max_decoding() / PAGE_DECODE_SHARE).clamp(1, DEFAULT_PAGE_BYTES),
            byte_limit: i64::MAX,
            seen_keys: 0,
            seen_bytes: 0,
            refusals: 0,
            kv,
            revision,
            hint: None,
            empty_windows: 0,
            started: false,
        }
    }

    /// The revision the scan reads at; 0 until the first page is read.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Starts with pages of `first` keys and doubles them up to the page
    /// size, so a consumer that works page by page starts sooner.
    pub fn ramp_up(mut self, first: usize) -> Self {
        self.limit = (first.max(1) as i64).min(self.page_size);
        self
    }

    /// Pages of at most about `bytes` encoded bytes (at least one key each),
    /// instead of [`DEFAULT_PAGE_BYTES`]; never more than a quarter of the
    /// client's decode limit whatever `bytes` says. See [`Scan`].
    #[must_use]
    pub fn with_page_bytes(mut self, bytes: usize) -> Self {
        self.page_bytes = bytes.min(self.kv.max_decoding() / PAGE_DECODE_SHARE).max(1);
        self
    }

    /// Whether the range is exhausted: `next_page` has nothing more to
    /// return. A page shorter than `page_size` does not say so: the byte
    /// budget and the windows make short pages too.
    pub fn is_done(&self) -> bool {
        self.next.is_none()
    }

    /// How many requests were refused as larger than the decode limit and
    /// asked again for fewer keys.
    pub fn refusals(&self) -> u64 {
        self.refusals
    }

    /// The key limit of the next request: the ramp's (at most `page_size`)
    /// and the byte budget's.
    fn request_limit(&self) -> i64 {
        self.limit.min(self.byte_limit)
    }

    /// Takes in a page read: its bytes per key set the byte budget's key
    /// limit.
    fn account(&mut self, kvs: &[KeyValue]) {
        if kvs.is_empty() {
            return;
        }
        let bytes: u64 = kvs.iter().map(|kv| entry_bytes(kv) as u64).sum();
        self.seen_keys += kvs.len() as u64;
        self.seen_bytes += bytes;
        let per_key = bytes_per_key((self.seen_bytes, self.seen_keys), (bytes, kvs.len() as u64));
        self.byte_limit = keys_within(self.page_bytes, per_key);
    }

    /// The next page, or `None` when the range is exhausted. The first call
    /// always returns a page (maybe empty), which pins the revision; later
    /// pages are never empty and hold at most `page_size` keys, and about
    /// the byte budget's worth of them (see [`Scan`]).
    ///
    /// A scan whose revision has been compacted away fails with
    /// [`Error::Compacted`](crate::Error::Compacted).
    pub async fn next_page(&mut self) -> Result<Option<Page>> {
        loop {
            let Some(from) = self.next.take() else {
                return Ok(None);
            };
            let window_end = match &self.hint {
                Some((a, b, f)) => clamp_window(extrapolate(a, b, *f), &from, &self.end),
                None => self.end.clone(),
            };
            let bounded = window_end != self.end;
            let limit = self.request_limit();
            let req = Range::between(from.clone(), window_end.clone())
                .limit(limit)
                .revision(self.revision);
            let resp = match self.kv.range(req).await {
                Ok(r) => r,
                Err(Error::ResponseTooLarge { limit: max }) if limit > 1 => {
                    // Over the decode limit all the same: ask the same
                    // window again for half the keys. The next page read
                    // sets the byte budget's limit afresh from its bytes.
                    self.refusals += 1;
                    self.byte_limit = limit / 2;
                    tracing::debug!(
                        keys = limit,
                        decode_limit = max,
                        refusals = self.refusals,
                        "scan: a page was over the decode limit; asking again for half the keys"
                    );
                    self.next = Some(from);
                    continue;
                }
                Err(e) => {
                    self.next = Some(from);
                    return Err(e);
                }
            };
            if self.revision == 0 {
                self.revision = resp.header.revision;
            }
            let more = resp.more;
            let kvs = resp.into_kvs();
            self.account(&kvs);
            if more {
                let (first, last) = match (kvs.first(), kvs.last()) {
                    (Some(f), Some(l)) => (f.key().clone(), l.key().clone()),
                    _ => return Ok(None),
                };
                let mut next = Vec::with_capacity(last.len() + 1);
                next.extend_from_slice(&last);
                next.push(0);
                self.next = Some(Bytes::from(next));
                // The next page likely spans as much key space as this
                // one. The window aims at the count page, not at the byte
                // budget's: one cut short by bytes is widened by as much.
                let f = (self.limit as f64 / kvs.len() as f64).max(1.0);
                self.empty_windows = 0;
                self.hint = (kvs.len() >= 2).then_some((first, last, f));
            } else if bounded {
                // The window is exhausted: the next one starts where it
                // ended, scaled to hold about a page; faster after empty
                // windows in a row.
                let n = kvs.len().max(1) as f64;
                let grow = ((self.limit * 2).min(self.page_size) as f64 / n).clamp(1.0, 8.0);
                self.empty_windows = if kvs.is_empty() {
                    self.empty_windows + 1
                } else {
                    0
                };
                let grow =
                    grow * EMPTY_GROWTH.powi(self.empty_windows.saturating_sub(1).min(16) as i32);
                self.hint = Some((from, window_end.clone(), grow));
                self.next = Some(window_end);
            }
            let first_call = !self.started;
            self.started = true;
            if !kvs.is_empty() {
                self.limit = (self.limit * 2).min(self.page_size);
            }
            if !kvs.is_empty() || first_call {
                return Ok(Some(Page {
                    revision: self.revision,
                    kvs,
                }));
            }
        }
    }

    /// The pages as a `Stream`, ending after the last page or the first
    /// error. Still one page at a time in memory.
    pub fn into_stream(self) -> impl futures_util::Stream<Item = Result<Page>> + Send {
        futures_util::stream::unfold(Some(self), |scan| async move {
            let mut scan = scan?;
            match scan.next_page().await {
                Ok(Some(page)) => Some((Ok(page), Some(scan))),
                Ok(None) => None,
                Err(e) => Some((Err(e), None)),
            }
        })
    }
}

/// The bytes one entry adds to a range response: the encoded `KeyValue`
/// with its field tag and length.
fn entry_bytes(kv: &KeyValue) -> usize {
    // `kvs` is field 2 of `RangeResponse`.
    prost::encoding::message::encoded_len(2, &kv.0)
}

/// The bytes per key to plan the next page with, from `(bytes, keys)` read
/// by the whole scan and by the last page: the larger of the two averages,
/// so a run of larger values is planned for at once while one page of
/// smaller ones does not undo a long average.
fn bytes_per_key(total: (u64, u64), last: (u64, u64)) -> u64 {
    let avg = |(bytes, keys): (u64, u64)| bytes.div_ceil(keys.max(1));
    avg(total).max(avg(last)).max(1)
}

/// How many keys of `per_key` bytes fit in `budget` bytes: at least one,
/// at most `i64::MAX`.
fn keys_within(budget: usize, per_key: u64) -> i64 {
    let n = (budget as u64) / per_key.max(1);
    i64::try_from(n).unwrap_or(i64::MAX).max(1)
}

/// The key `f` times the distance from `a` to `b` beyond `b`, measured in
/// the eight bytes after their common prefix. `None` when that cannot be
/// told (no distance), or past the end of the keyspace.
///
/// Public but hidden for one reader: the client bench pages etcd-client
/// with exactly this crate's windows, and must not keep a copy that could
/// drift from it.
#[doc(hidden)]
pub fn extrapolate(a: &[u8], b: &[u8], f: f64) -> Option<Bytes> {
    let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let word = |s: &[u8]| {
        let mut buf = [0u8; 8];
        for (d, x) in buf.iter_mut().zip(&s[common..]) {
            *d = *x;
        }
        u64::from_be_bytes(buf)
    };
    let (va, vb) = (word(a), word(b));
    if vb <= va {
        return None;
    }
    let step = (((vb - va) as f64) * f).max(1.0) as u128;
    let v = u128::from(vb).saturating_add(step);
    if v > u128::from(u64::MAX) {
        // Past everything under the common prefix; a carry of more than a
        // byte past everything under a shorter one (one level up per byte).
        let carry = (v >> 64) as u64;
        let levels = (64 - carry.leading_zeros()).div_ceil(8) as usize;
        let keep = (common + 1).saturating_sub(levels.max(1));
        return (keep > 0).then(|| prefix_end(&b[..keep]));
    }
    let mut out = b[..common].to_vec();
    out.extend_from_slice(&(v as u64).to_be_bytes());
    while out.len() > common + 1 && out.last() == Some(&0) {
        out.pop();
    }
    Some(Bytes::from(out))
}

/// A window end strictly after `from` and no further than `end` (where
/// `[0]` means the end of the keyspace).
fn clamp_window(w: Option<Bytes>, from: &[u8], end: &Bytes) -> Bytes {
    let unbounded = |k: &[u8]| k == [0];
    match w {
        Some(w) if !unbounded(&w) && w.as_ref() > from && (unbounded(end) || w < *end) => w,
        _ => end.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::{PbKeyValue, PbRangeResponse, PbResponseHeader};

    /// A scan over a plain range call reads every key in `[from, end)`
    /// once, in order, at one revision, through its windows and pages.
    #[tokio::test]
    async fn a_scan_over_any_range_call_tiles_the_range() {
        let keys: Vec<Vec<u8>> = (0..103)
            .map(|i| format!("/s/{i:04}").into_bytes())
            .collect();
        let store = Arc::new(keys.clone());
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = calls.clone();
        let range = move |req: Range| {
            let store = store.clone();
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move {
                let r = req.0;
                let within: Vec<&Vec<u8>> = store
                    .iter()
                    .filter(|k| **k >= r.key && (r.range_end.is_empty() || **k < r.range_end))
                    .collect();
                let limit = if r.limit > 0 {
                    r.limit as usize
                } else {
                    usize::MAX
                };
                let kvs = within
                    .iter()
                    .take(limit)
                    .map(|k| PbKeyValue {
                        key: (*k).clone().into(),
                        value: b"v".to_vec().into(),
                        ..Default::default()
                    })
                    .collect();
                Ok(RangeResponse::from(PbRangeResponse {
                    header: Some(PbResponseHeader {
                        revision: 7,
                        ..Default::default()
                    }),
                    more: within.len() > limit,
                    count: within.len() as i64,
                    kvs,
                }))
            }
        };
        let mut scan = Scan::with_range(range, "/s/0", "/s/1", 10, 0);
        let mut seen = Vec::new();
        while let Some(page) = scan.next_page().await.unwrap() {
            assert_eq!(page.revision, 7);
            seen.extend(page.kvs.iter().map(|kv| kv.key().to_vec()));
        }
        assert_eq!(seen, keys);
        assert!(calls.load(std::sync::atomic::Ordering::Relaxed) >= 10);
    }

    #[test]
    fn byte_budgets_become_key_limits() {
        // 16 MiB of 200-byte entries: more keys than any page size.
        assert_eq!(keys_within(16 << 20, 200), 83_886);
        // 20 KiB entries in a quarter of a 1 MiB decode limit.
        assert_eq!(keys_within(256 << 10, 20 << 10), 12);
        // One entry over the budget still makes a page of one key.
        assert_eq!(keys_within(1 << 20, 4 << 20), 1);
        assert_eq!(keys_within(0, 100), 1);
        assert_eq!(keys_within(100, 0), 100);
        assert_eq!(keys_within(usize::MAX, 1), i64::MAX);
        // The larger average wins, rounded up.
        assert_eq!(bytes_per_key((1000, 10), (300, 2)), 150);
        assert_eq!(bytes_per_key((1000, 10), (100, 2)), 100);
        assert_eq!(bytes_per_key((1001, 10), (0, 0)), 101);
        assert_eq!(bytes_per_key((0, 0), (0, 0)), 1);
    }

    #[test]
    fn windows_extrapolate_past_the_last_key() {
        // Twice the distance from a to b, beyond b.
        let w = extrapolate(b"/k/0100", b"/k/0200", 1.0).unwrap();
        assert!(
            w.as_ref() > b"/k/0200".as_slice() && w.as_ref() < b"/k/9".as_slice(),
            "{w:?}"
        );
        // No distance: no hint.
        assert_eq!(extrapolate(b"/k/1", b"/k/1", 1.0), None);
        assert_eq!(extrapolate(b"/k/2", b"/k/1", 1.0), None);
        // Overflowing the common prefix's space ends at its prefix end.
        let w = extrapolate(b"/k/\x00", b"/k/\xff\xff\xff\xff\xff\xff\xff\xff", 4.0).unwrap();
        assert_eq!(w, Bytes::from_static(b"/k0"));
        // Overflowing it by more than a byte's worth climbs as many levels.
        let w = extrapolate(b"/a/k/\x00", b"/a/k/\x01", 1e8).unwrap();
        assert_eq!(w, Bytes::from_static(b"/a0"));
        assert_eq!(extrapolate(b"/k/\x00", b"/k/\x01", 1e30), None);
        // Windows stay inside (from, end].
        let end = Bytes::from_static(b"/k0");
        assert_eq!(
            clamp_window(Some(Bytes::from_static(b"/z")), b"/k/1", &end),
            end
        );
        assert_eq!(
            clamp_window(Some(Bytes::from_static(b"/k/0")), b"/k/1", &end),
            end
        );
        assert_eq!(clamp_window(None, b"/k/1", &end), end);
        let inside = Bytes::from_static(b"/k/5");
        assert_eq!(clamp_window(Some(inside.clone()), b"/k/1", &end), inside);
        let to_the_end = Bytes::from_static(&[0]);
        assert_eq!(
            clamp_window(Some(inside.clone()), b"/k/1", &to_the_end),
            inside
        );
    }
}
