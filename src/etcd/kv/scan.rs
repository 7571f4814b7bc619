//! Paginated scans at one revision.

use bytes::Bytes;

use crate::etcd::error::Result;

use super::service::KvClient;
use super::types::{KeyValue, Range, prefix_end};

/// A paginated scan at a fixed revision; see
/// [`Client::scan`](crate::etcd::Client::scan).
///
/// etcd 3.4 answers a range with a limit only after walking the index over
/// the whole rest of the range, so plain pagination costs O(n²/page): a
/// million keys in pages of 2000 take minutes. The scan therefore bounds each
/// request to a *window* whose end it extrapolates from the density of the
/// keys it has seen, aiming at one page per window, and widens the window
/// when it comes back short. Each request then costs about one page, and the
/// pages still tile the range in key order at one revision.
pub struct Scan {
    kv: KvClient,
    next: Option<Bytes>,
    end: Bytes,
    page_size: i64,
    /// The limit of the next request: ramps up to `page_size`.
    limit: i64,
    revision: i64,
    /// Where the next window ends: extrapolated from `(a, b)` by `factor`
    /// times their distance beyond `b`. None: to the end of the range.
    hint: Option<(Bytes, Bytes, f64)>,
    started: bool,
}

/// One page of a [`Scan`].
#[derive(Debug)]
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
        Scan {
            kv,
            next: Some(from),
            end,
            page_size: page_size.max(1) as i64,
            limit: page_size.max(1) as i64,
            revision,
            hint: None,
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

    /// The next page, or `None` when the range is exhausted. The first call
    /// always returns a page (maybe empty), which pins the revision; later
    /// pages are never empty and hold at most `page_size` keys.
    ///
    /// A scan whose revision has been compacted away fails with
    /// [`Error::Compacted`](crate::etcd::Error::Compacted).
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
            let req = Range::between(from.clone(), window_end.clone())
                .limit(self.limit)
                .revision(self.revision);
            let resp = match self.kv.range(req).await {
                Ok(r) => r,
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
            if more {
                let (first, last) = match (kvs.first(), kvs.last()) {
                    (Some(f), Some(l)) => (f.key().clone(), l.key().clone()),
                    _ => return Ok(None),
                };
                let mut next = Vec::with_capacity(last.len() + 1);
                next.extend_from_slice(&last);
                next.push(0);
                self.next = Some(Bytes::from(next));
                // The next page likely spans as much key space as this one.
                self.hint = (kvs.len() >= 2).then_some((first, last, 1.0));
            } else if bounded {
                // The window is exhausted: the next one starts where it
                // ended, scaled to hold about a page.
                let n = kvs.len().max(1) as f64;
                let grow = ((self.limit * 2).min(self.page_size) as f64 / n).clamp(1.0, 8.0);
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

/// The key `f` times the distance from `a` to `b` beyond `b`, measured in
/// the eight bytes after their common prefix. `None` when that cannot be
/// told (no distance), or past the end of the keyspace.
fn extrapolate(a: &[u8], b: &[u8], f: f64) -> Option<Bytes> {
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
    let v = u128::from(vb) + step;
    if v > u128::from(u64::MAX) {
        // Past everything under the common prefix.
        return (common > 0).then(|| prefix_end(&b[..common]));
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
