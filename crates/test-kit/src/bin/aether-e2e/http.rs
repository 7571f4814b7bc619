//! A minimal HTTP/1.0 client for loopback: the replicas' /metrics, /healthz
//! and /readyz, Prometheus's API, etcd's JSON gateway. HTTP/1.0 so that no
//! server answers chunked and the body simply ends with the connection.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// `(status, body)` of a request to 127.0.0.1:`port`, bounded by `timeout`.
pub(crate) fn request(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
) -> Result<(u16, String), String> {
    let deadline = Instant::now() + timeout;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("{addr}: {e}"))?;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    s.set_write_timeout(Some(left()))
        .map_err(|e| e.to_string())?;
    let mut req =
        format!("{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    if let Some(b) = body {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body.unwrap_or(""));
    s.write_all(req.as_bytes())
        .map_err(|e| format!("{addr}: {e}"))?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        s.set_read_timeout(Some(left()))
            .map_err(|e| e.to_string())?;
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            // A signal (the churn's SIGTERM) is no failure of the server.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("{addr}{path}: {e}")),
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{addr}{path}: no complete answer within {timeout:?}"
            ));
        }
    }
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{addr}{path}: no HTTP answer"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("{addr}{path}: bad status line"))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    Ok((
        code,
        if chunked {
            dechunk(body)
        } else {
            body.to_string()
        },
    ))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The body of a 200 answer to GET, or None.
pub(crate) fn get(port: u16, path: &str, timeout: Duration) -> Option<String> {
    match request(port, "GET", path, None, timeout) {
        Ok((200, b)) => Some(b),
        _ => None,
    }
}

/// The status of GET `path` as curl's `%{http_code}` would print it
/// ("000" when there is no answer).
pub(crate) fn code(port: u16, path: &str) -> String {
    match request(port, "GET", path, None, Duration::from_secs(2)) {
        Ok((c, _)) => c.to_string(),
        Err(_) => "000".into(),
    }
}

/// A replica's metrics page (empty if unreachable).
pub(crate) fn metrics_of(port: u16) -> String {
    get(port, "/metrics", Duration::from_secs(2)).unwrap_or_default()
}

pub(crate) fn urlencode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `k="v"` pairs of a series' label set (`{...}` included or not).
fn labels(series: &str) -> Vec<(String, String)> {
    let Some(i) = series.find('{') else {
        return Vec::new();
    };
    let body = series[i + 1..].trim_end_matches('}');
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(eq) = rest.find("=\"") {
        let k = rest[..eq].trim_start_matches(',').trim().to_string();
        let after = &rest[eq + 2..];
        let mut end = None;
        let mut esc = false;
        for (j, c) in after.char_indices() {
            match c {
                '\\' if !esc => esc = true,
                '"' if !esc => {
                    end = Some(j);
                    break;
                }
                _ => esc = false,
            }
        }
        let Some(end) = end else { break };
        out.push((k, after[..end].to_string()));
        rest = &after[end + 1..];
    }
    out
}

/// The value of the first sample in the metrics page `text` named as
/// `selector` (`name{label="v",...}`) with at least its labels.
pub(crate) fn metric(text: &str, selector: &str) -> Option<String> {
    let name = selector.split('{').next().unwrap_or("");
    let want = labels(selector);
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        // The series ends at the last space before the value (label values
        // may hold spaces).
        let (series, value) = l.trim_end().rsplit_once(' ')?;
        let series = series.trim();
        if series.split('{').next() != Some(name) {
            return None;
        }
        let have = labels(series);
        want.iter()
            .all(|w| have.contains(w))
            .then(|| value.to_string())
    })
}

/// The sum of every sample of metric `name` in `text` (any labels).
pub(crate) fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.trim_end().rsplit_once(' '))
        .filter(|(s, _)| s.split('{').next() == Some(name))
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum()
}

pub(crate) fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= c.len() {
                out.push(T[(n >> (18 - 6 * k)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_matches_a_subset_of_the_labels() {
        let page = "# HELP x\naether_replicator_peer_synced{region=\"a\",peer=\"b\"} 1\n\
                    aether_replicator_peer_synced{region=\"a\",peer=\"c\"} 0\naether_replicator_is_leader 1\n";
        assert_eq!(
            metric(page, "aether_replicator_peer_synced{peer=\"c\"}").as_deref(),
            Some("0")
        );
        assert_eq!(
            metric(page, "aether_replicator_is_leader").as_deref(),
            Some("1")
        );
        assert_eq!(
            metric(page, "aether_replicator_peer_synced{peer=\"d\"}"),
            None
        );
        assert_eq!(metric_sum(page, "aether_replicator_peer_synced"), 1.0);
    }

    #[test]
    fn base64_pads() {
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
    }

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(dechunk("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"), "abcde");
    }
}
